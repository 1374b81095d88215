"""A running worker's progress: its pace and the stragglers found from it, and the stalls
found when it stops (each stalled from its own last progress). Pure, as every lifecycle rule
(lifecycle/rules.py)."""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from typing import Any

from backend.config import format_duration
from backend.lifecycle.sentences import CONTAINER_RUNNING, slurm_running
from backend.lifecycle.states import RUNNING, Phase
from backend.lifecycle.views import (
    CheckpointSeen,
    Effects,
    RunView,
    WorkerView,
    running_reason,
    set_run,
    set_worker,
)

# A straggler: a gang member at under half its gang's median pace for three minutes or more.
STRAGGLER_PACE = 0.5
STRAGGLER_AFTER = timedelta(minutes=3)


def worker_progress(
    run: RunView,
    w: WorkerView,
    at: datetime,
    fx: Effects,
    *,
    step: int | None = None,
    checkpoint_step: int | None = None,
) -> None:
    """A progress report or a new log line: not stalled (any more); with a step, its pace,
    the highest step reached, its last checkpoint, and whether it redoes work no more.

    A worker whose workload reports its steps (this attempt) makes progress by its steps
    alone: a gang that only prints while it waits (rendezvous retries, NCCL warnings) is
    found stalled all the same. The step and checkpoint of a worker being stopped (its last
    report, read as it ended) still count for its run's rework.

    Progress is never dated before the worker's current state began: what a report's time
    says happened before it (a Slurm job queued again writes on in the same output file, and
    the agent dates the earlier instance's lines copied for the new one by the file's last
    write) is news of now, not of then; a stall found from it would be dated before the
    instance it stops, its ledger recounting time the instance never held."""
    checkpointed = False
    if step is not None and w.alive:
        if checkpoint_step is not None and checkpoint_step != w.checkpoint_step:
            fx.checkpoints.append(CheckpointSeen(w.id, checkpoint_step, at, _pause(w, step, at)))
            checkpointed = True
        _redo(w, step, checkpoint_step, at, fx)
    if w.state != RUNNING or w.stop_cause:
        return
    if step is None and w.progress_step is not None:
        return  # it reports its steps: output alone (a retry warning a second) is no progress
    if step is not None:
        # its own times, in its own order (its clock may be behind); a checkpoint's pause is not
        # its pace (it is what the checkpoint cost, measured against that pace)
        _measure_pace(w, step, at, counted=not checkpointed)
    at = max(at, w.since or at)
    if w.progress_at is None or at > w.progress_at:
        w.progress_at = at
    if w.stalled_since is not None:
        w.stalled_since = None
        # (a Slurm job's worker reads again as it did before it stalled)
        running = CONTAINER_RUNNING if run.slurm_job is None else slurm_running(run.slurm_job)
        set_worker(fx, run, w, RUNNING, running, Phase.RUNNING, at)
        if run.state == RUNNING and run.stop_cause is None:
            set_run(fx, run, RUNNING, running_reason(run), at)  # stalled no more (or fewer)


def _pause(w: WorkerView, step: int, at: datetime) -> float | None:
    """What a checkpoint reported with ``step`` at ``at`` cost: the time since the worker's
    previous step report less what the steps between took at its pace (its workload writes
    its progress a step at a time, dated when written: the pause is the checkpoint's). None
    where its pace is not known yet, or the report is not after the previous."""
    before, then, rate = w.progress_step, w.stepped_at, w.progress_rate
    if before is None or then is None or not rate or at <= then or step < before:
        return None
    return max((at - then).total_seconds() - (step - before) / rate, 0.0)


def _measure_pace(w: WorkerView, step: int, at: datetime, *, counted: bool = True) -> None:
    previous_step, previous_at = w.progress_step, w.stepped_at
    if counted and previous_step is not None and previous_at is not None and at > previous_at:
        pace = max(step - previous_step, 0) / (at - previous_at).total_seconds()
        w.progress_rate = pace if w.progress_rate is None else (w.progress_rate + pace) / 2
    if previous_at is None or at > previous_at:
        w.progress_step, w.stepped_at = step, at


def _redo(w: WorkerView, step: int, checkpoint_step: int | None, at: datetime, fx: Effects) -> None:
    """The highest step and the last checkpoint, kept over attempts; after a restart, the
    step that reaches the one its run had reached ends the work done again (a redo)."""
    if w.reached_step is None or step > w.reached_step:
        w.reached_step = step
    if checkpoint_step is not None:
        w.checkpoint_step = checkpoint_step
    if w.redo_until is not None and step >= w.redo_until:
        w.redo_until = None
        fx.caught_up.append(at)


def find_stragglers(run: RunView, now: datetime) -> None:
    """Mark the running gang members whose pace stays well below the gang's median."""
    if run.state != RUNNING or run.stop_cause is not None:
        return

    def progress(w: WorkerView) -> float | None:
        return w.progress_rate

    def utilisation(w: WorkerView) -> float | None:
        return w.gpu_utilization if w.gpus else None

    # Progress reports when the gang makes them, else (without) its GPUs' utilisation.
    pace = progress
    paces = [p for w in run.workers if (p := pace(w)) is not None]
    if len(paces) < 2:
        pace = utilisation
        paces = [p for w in run.workers if (p := pace(w)) is not None]
    if len(paces) < 2:
        return
    median = statistics.median(paces)
    for w in run.workers:
        mine = pace(w)
        slow = mine is not None and mine < STRAGGLER_PACE * median
        if slow and w.slow_since is None:
            w.slow_since = now
        elif not slow:
            w.slow_since = None


def is_straggler(w: WorkerView | Any, now: datetime) -> bool:
    """Slow for several minutes: a straggler (a flag, not a state)."""
    return w.state == RUNNING and w.slow_since is not None and now - w.slow_since >= STRAGGLER_AFTER


def stalled_by(run: RunView, at: datetime, quiet_for: timedelta) -> list[WorkerView]:
    """The running workers quiet for ``quiet_for`` at ``at`` not yet found stalled, those quiet
    longest first."""
    found = [
        w
        for w in run.workers
        if w.state == RUNNING
        and w.stop_cause is None
        and w.stalled_since is None
        and w.progress_at is not None
        and at - w.progress_at >= quiet_for
    ]
    return sorted(found, key=lambda w: (w.progress_at, w.rank))


def mark_stalled(run: RunView, w: WorkerView, reason: str, fx: Effects) -> None:
    """Stalled from its own last progress (a transition dated back to it: the goodput tick
    recounts what it had counted since, DESIGN §4 invariant 3)."""
    assert w.progress_at is not None
    w.stalled_since = w.progress_at
    set_worker(fx, run, w, RUNNING, reason, Phase.STALLED, w.progress_at)


def find_stalls(run: RunView, at: datetime, fx: Effects) -> list[WorkerView]:
    """Every running worker whose progress stopped for the stall timeout is stalled, each from
    its own last progress, whatever stops the gang (a stall, a failure, a stop) first."""
    timeout = run.policy.stall_timeout
    if timeout is None:
        return []
    found = stalled_by(run, at, timeout)
    for w in found:
        mark_stalled(run, w, f"Stalled: no progress for {format_duration(timeout)}", fx)
    return found
