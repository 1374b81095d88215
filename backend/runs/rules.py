"""Pure rules for runs: states, the sentences that explain them, the records a new run makes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from backend.runs.spec import RunSpec


class RunState(StrEnum):
    PENDING = "Pending"
    PREPARING = "Preparing"
    PULLING = "Pulling"
    STARTING = "Starting"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"
    DELETED = "Deleted"


class WorkerState(StrEnum):
    """A worker's states: a run's, but Deleted, and with Stopping while it winds down."""

    PENDING = "Pending"
    PREPARING = "Preparing"
    PULLING = "Pulling"
    STARTING = "Starting"
    RUNNING = "Running"
    STOPPING = "Stopping"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"


class Wait(StrEnum):
    """What a run or worker not yet started waits for, stored beside the reason that says it
    (runs.waits_for, workers.waits_for): the advice of runs/failures.py is chosen by it, never
    by reading the sentence. A restart's wait and the gang barrier are told by their states."""

    # a pending run, as the scheduler decided
    MACHINES = "machines"  # No machine fits … / Gang cannot be placed whole …
    QUEUE = "queue"  # Queued behind … / Next to run … / Waits for namespace quota …
    PLAN = "plan"  # Cannot plan workers …
    CONTAINERS = "containers"  # No machine runs containers …
    # a preparing or pulling worker (and its run, which says its slowest worker's), as its
    # machine's agent reported it
    SECRET = "secret"  # waiting for external secret …
    DRIVE = "drive"  # Waiting for drive … to be filled
    IMAGE = "image"  # Pulling image …


ENDED_RUN_STATES = frozenset(
    {RunState.COMPLETED, RunState.FAILED, RunState.STOPPED, RunState.DELETED}
)

RUN_CREATED = "Run created"
WORKER_CREATED = "Waiting to be placed with its gang"


def worker_name(run_name: str, rank: int) -> str:
    """``<run>-<rank>``: the rank after the last '-' tells a worker's run apart unambiguously."""
    return f"{run_name}-{rank}"


def is_ended(state: str) -> bool:
    return state in ENDED_RUN_STATES


@dataclass(frozen=True)
class NewWorker:
    rank: int
    name: str
    gpus: int


@dataclass(frozen=True)
class NewRun:
    name: str
    priority: int
    worker_count: int
    gpus_per_worker: int
    state: RunState
    reason: str
    created_at: datetime
    workers: tuple[NewWorker, ...]


def plan_new_run(spec: RunSpec, now: datetime) -> NewRun:
    """A submitted run starts Pending, its workers too, each waiting for the gang's placement."""
    workers = tuple(
        NewWorker(rank=rank, name=worker_name(spec.name, rank), gpus=spec.gpus)
        for rank in range(spec.workers)
    )
    return NewRun(
        name=spec.name,
        priority=spec.priority,
        worker_count=spec.workers,
        gpus_per_worker=spec.gpus,
        state=RunState.PENDING,
        reason=RUN_CREATED,
        created_at=now,
        workers=workers,
    )


def task_counts(states: Iterable[str]) -> dict[str, int]:
    """How many of a run's workers are in each state, every state named (0 when none)."""
    counted = Counter(states)
    return {state.value: counted.get(state.value, 0) for state in WorkerState}
