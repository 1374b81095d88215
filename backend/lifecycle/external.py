"""Runs that a scheduler outside Astraeus runs (Slurm: backend/slurm/), as the lifecycle's
states (issue 38: one state machine). The outside scheduler's facts come as changes dated by
it (``Change``: a state the run and each worker entered, its accounting phase, whether the
workers hold their GPUs from then) and, for a run Astraeus submitted, how each worker's task
ended (``TaskEnd``); ``enter`` makes them the run's and workers' states and reasons, in the
lifecycle's sentences and causes, and writes each as a transition (``record_transition``):
a stop asked here ends as "Stopped by <user>", a stall the lifecycle found ends or requeues as
it asked, a failed run names the worker that failed first as the lifecycle orders a gang's
failures."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.clock import iso_offset
from backend.lifecycle.endings import PEER_LOST, PEER_LOST_GRACE, snapshot_output
from backend.lifecycle.records import record_transition
from backend.lifecycle.sentences import EndCause, exited_with, worker_failed_sentence
from backend.lifecycle.states import Cause, Phase, RunState
from backend.models import Run, Worker, Workspace


@dataclass(frozen=True)
class Change:
    """A state the run (and each worker) entered, at the outside scheduler's time for it."""

    at: datetime
    state: str
    phase: str  # each worker's accounting phase from here
    held: bool  # each worker holds its GPUs from here
    run_reason: str
    worker_reason: str
    cause: str | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class TaskEnd:
    """How one worker of a run Astraeus submitted ended, as its task wrote it on its node
    (agent.slurm_task)."""

    rank: int
    node: str | None
    ended_at: datetime
    exit_code: int
    signal: int | None
    log_tail: str


def task_end_sentence(end: TaskEnd) -> str:
    if end.signal:
        return f"Killed by signal {end.signal}"
    return exited_with(end.exit_code)


def peer_lost(end: TaskEnd) -> bool:
    """It died of another rank's end (its log says the connection to a peer was lost), as the
    lifecycle reads a worker's snapshot."""
    return PEER_LOST.search(end.log_tail) is not None


def first_failure(ends: list[TaskEnd]) -> TaskEnd | None:
    """The worker that failed first, as the lifecycle orders a gang's failures: by when each
    ended, one that died of a lost peer counted PEER_LOST_GRACE later (it often ends before the
    rank that crashed has finished exiting). A rank Slurm ended because another failed
    (--kill-on-bad-exit: a signal) is a consequence; it is the first only where no rank exited
    with a code of its own."""
    failed = [e for e in ends if e.exit_code != 0]
    own = [e for e in failed if not e.signal]
    chosen = own or failed

    def order(e: TaskEnd) -> tuple[datetime, int]:
        return (e.ended_at + PEER_LOST_GRACE if peer_lost(e) else e.ended_at, e.rank)

    return min(chosen, key=order) if chosen else None


@dataclass(frozen=True)
class Placement:
    """Where the outside scheduler runs each worker (by rank) now: the node's name and its
    machine here, its GPUs there; how each worker's task ended where it said so; and whether
    the job runs now (a worker placed while it does is watched on its node)."""

    nodes: dict[int, str] = field(default_factory=dict)
    machines: dict[int, int] = field(default_factory=dict)
    gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)
    ends: dict[int, TaskEnd] = field(default_factory=dict)
    live: bool = False


# Placed at run time: (rank, worker, when) -> None (the outside scheduler's watch of it)
Watch = Callable[[int, Worker, datetime], None]


def enter(
    session: AsyncSession,
    ws: Workspace,
    run: Run,
    workers: list[Worker],
    change: Change,
    placement: Placement,
    watch: Watch,
) -> list[int]:
    """The run and each worker enter the change's state at its time, in history. At a
    submitted run's end each worker ends as its task said, and a failed run names the worker
    that failed first (the earliest to exit with an error of its own). A worker placed on a
    node while its job runs is watched there (``watch``); the workers whose watches end (the
    job ended, or was queued again) are returned."""
    change = as_the_stall_asked(run, change)
    running = change.state == RunState.RUNNING.value
    ended = change.phase == Phase.ENDED.value
    requeued = change.phase in REQUEUED
    failed = ended and change.state == RunState.FAILED.value
    # (a job cancelled because its run stalled failed for that, not for its tasks' ends)
    stalled = run.stop_cause == Cause.STALL
    first = first_failure(list(placement.ends.values())) if failed and not stalled else None
    run_reason = change.run_reason
    asked = asked_to_stop(run, change)
    if asked:
        run_reason = f"Stopped by {run.stop_by}"  # asked here, cancelled in Slurm
    if first is not None:
        run_reason = worker_failed_sentence(
            workers[first.rank].name, first.node, task_end_sentence(first)
        )
    # placed: its first start, or placed again after a requeue (then running right after)
    placing = change.phase == Phase.RESTART or (running and run.state != RunState.STARTING.value)
    run.state, run.reason, run.state_since = change.state, run_reason, change.at
    run.waits_for = None
    if placing:
        run.attempt += 1
        run.placed_at = change.at
        run.restart_at = None
    if running:
        run.running_since = change.at
        run.started_at = run.started_at or change.at
    if ended:
        run.ended_at, run.running_since, run.cause = change.at, None, change.cause
    if requeued:
        run.running_since = run.placed_at = None
        run.stop_cause = None  # (a stall's restart: asked, and done)
    ending: dict[int, tuple[str, str]] = {}  # rank -> (state, reason) at the end
    for rank, w in enumerate(workers):
        state, reason = change.state, change.worker_reason
        if asked:
            state, reason = _stopped_end(placement.ends.get(rank), run_reason)
        elif ended and placement.ends:
            state, reason = _task_end(change, placement.ends.get(rank), first, workers)
        ending[rank] = (state, reason)
        w.state, w.reason, w.state_since, w.phase = state, reason, change.at, change.phase
        if placing:
            w.machine_id = placement.machines.get(rank)
            w.attempt = run.attempt
            w.gpu_ids = list(placement.gpus.get(rank, ()))
            # a new instance: nothing of the last one's progress (nor stall) goes on
            w.stalled_since = w.progress_at = w.progress_step = None
            w.stepped_at = w.progress_rate = w.slow_since = None
            if w.machine_id is not None and placement.live:
                watch(rank, w, change.at)
        if requeued:
            w.restarts += 1
        if ended:
            end = placement.ends.get(rank)
            w.exit_code = end.exit_code if end else change.exit_code
            w.cause = change.cause if state == RunState.FAILED.value else None
            if state == RunState.FAILED.value and (end is not None or rank == 0):
                w.last_failure = {
                    "reason": reason,
                    "failed_at": iso_offset(end.ended_at if end else change.at),
                    "exit_code": w.exit_code,
                    "log_tail": snapshot_output(end.log_tail) if end else "",
                }
    if failed and workers and not stalled:
        by = workers[first.rank] if first is not None else workers[0]
        run.first_failure = {
            "worker": by.name,
            "machine": first.node if first is not None else placement.nodes.get(0),
            "reason": task_end_sentence(first) if first is not None else change.worker_reason,
            "cause": change.cause,
            "at": iso_offset(first.ended_at if first is not None else change.at),
            "peer_lost": first is not None and peer_lost(first),
        }
    record_transition(session, ws, run, None, change.state, run_reason, change.at)
    for rank, w in enumerate(workers):
        state, reason = ending[rank]
        record_transition(
            session, ws, run, w, state, reason, change.at, phase=change.phase, held=change.held
        )
    if not (ended or requeued):
        return []
    placed = [w.id for w in workers if w.machine_id is not None]
    for w in workers:
        w.machine_id = None
    return placed


REQUEUED = (
    Phase.REQUEUED_PREEMPTION,
    Phase.REQUEUED_FAILURE,
    Phase.REQUEUED_STALL,
    Phase.REQUEUED_ADMIN,
)


def as_the_stall_asked(run: Run, change: Change) -> Change:
    """A job the lifecycle asked to restart (or end) because its run stalled: queued again
    by Slurm it waits as a stall's restart (*stalled*, not held), in the sentence the
    lifecycle wrote; cancelled, its run fails with it."""
    if run.stop_cause != Cause.STALL:
        return change
    if change.phase in REQUEUED:
        waiting = f"Waiting to be placed again: {run.reason}"
        return dataclasses.replace(
            change,
            phase=Phase.REQUEUED_STALL.value,
            run_reason=run.reason,
            worker_reason=waiting,
            cause=EndCause.STALLED.value,
        )
    if change.phase == Phase.ENDED.value and change.state == RunState.STOPPED.value:
        return dataclasses.replace(
            change, state=RunState.FAILED.value, run_reason=run.reason, cause=run.cause
        )
    return change


def asked_to_stop(run: Run, change: Change) -> bool:
    """The job's end is the stop asked here (its owner's, cancelled in Slurm by the import)."""
    return (
        change.phase == Phase.ENDED.value
        and change.state == RunState.STOPPED.value
        and run.stop_cause == Cause.OWNER
    )


def _stopped_end(end: TaskEnd | None, stopped: str) -> tuple[str, str]:
    """A submitted run's worker when the stop asked here ended its job: stopped as the run is
    (as the lifecycle stops an agent's worker: "Stopped by alice"), not failed of the signal
    scancel ended its task with; one whose task had completed before stays Completed."""
    if end is not None and end.exit_code == 0 and not end.signal:
        return RunState.COMPLETED.value, task_end_sentence(end)
    return RunState.STOPPED.value, stopped


def _task_end(
    change: Change,
    end: TaskEnd | None,
    first: TaskEnd | None,
    workers: list[Worker],
) -> tuple[str, str]:
    """A submitted run's worker at its job's end: as its task ended, or stopped with its gang."""
    if end is not None and end.exit_code == 0:
        return RunState.COMPLETED.value, task_end_sentence(end)
    if end is not None and (first is None or end.rank == first.rank or not end.signal):
        return RunState.FAILED.value, task_end_sentence(end)
    if first is not None:
        return RunState.STOPPED.value, f"Stopping: worker {workers[first.rank].name} failed"
    return change.state, change.worker_reason
