"""Pure rules for runs: the records a new run makes, its workers' names, its tasks' counts. (A
run's and a worker's states are the lifecycle's words: backend/lifecycle/states.py.)"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from backend.lifecycle.states import RunState, WorkerState
from backend.spec import RunSpec

RUN_CREATED = "Run created"
WORKER_CREATED = "Waiting to be placed with its gang"


def worker_name(run_name: str, rank: int) -> str:
    """``<run>-<rank>``: the rank after the last '-' tells a worker's run apart unambiguously."""
    return f"{run_name}-{rank}"


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
