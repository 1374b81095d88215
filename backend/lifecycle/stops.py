"""What stops a gang from outside its workers: its owner, its time limit, a preemption, a drain,
the gang barrier's timeout, a lost machine; and its deletion. Each says why, then asks the gang
to stop (endings.stop_gang) or ends its workers (endings.worker_exited). Pure, as every
lifecycle rule (lifecycle/rules.py)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from backend.config import format_duration
from backend.lifecycle.endings import BARRIER_TIMEOUT, release_room, stop_gang, worker_exited
from backend.lifecycle.sentences import (
    End,
    EndCause,
    drained_sentence,
    idle_sentence,
    preempted_sentence,
    time_limit_sentence,
)
from backend.lifecycle.states import DELETED, ENDED_STATES, STOPPED, STOPPING, Cause, Phase
from backend.lifecycle.views import Command, Effects, RunView, WorkerView, set_run, set_worker


def stop(run: RunView, by: str, at: datetime, fx: Effects) -> None:
    """Its owner asked: wind down (counted productive), then Stopped."""
    run.reason, run.cause = f"Stopping: asked by {by}", None
    stop_gang(run, Cause.OWNER, by, f"Stopping: asked by {by}", at, fx)


def time_limit_reached(run: RunView, at: datetime, fx: Effects) -> None:
    assert run.policy.time_limit is not None
    sentence = time_limit_sentence(run.policy.time_limit)
    run.reason, run.cause = f"Stopping: {sentence.lower()}", None
    stop_gang(
        run,
        Cause.TIME_LIMIT,
        None,
        f"Stopping: the run {sentence[0].lower()}{sentence[1:]}",
        at,
        fx,
    )


def idle_reached(run: RunView, at: datetime, fx: Effects) -> None:
    """Its idle policy found every GPU under its utilization for the window: wind down (its
    GPUs still idle), then Stopped, not restarted."""
    rule = run.policy.idle
    if rule is None or run.ended or run.stop_cause is not None:
        return
    sentence = f"Stopping — {idle_sentence(rule.below, rule.window)}"
    run.reason, run.cause = sentence, None
    stop_gang(run, Cause.IDLE, None, sentence, at, fx)


def preempt(run: RunView, by_run: str, at: datetime, fx: Effects) -> None:
    """Stop for higher-priority work; the run is queued again, not failed."""
    if run.stop_cause is not None:
        return  # already winding down: its own cause (a failure to count, an owner) decides
    run.reason, run.cause = preempted_sentence(by_run), EndCause.PREEMPTED
    stop_gang(run, Cause.PREEMPTION, by_run, preempted_sentence(by_run), at, fx)


def drain_preempt(run: RunView, machine: str, at: datetime, fx: Effects) -> None:
    """A machine of the gang is drained: the run stops and is queued again, like a preemption."""
    if run.stop_cause is not None:
        return  # already winding down: its own cause (a failure to count, an owner) decides
    sentence = drained_sentence(machine)
    run.reason, run.cause = sentence, EndCause.PREEMPTED
    stop_gang(run, Cause.DRAIN, machine, sentence, at, fx)


def barrier_timed_out(run: RunView, at: datetime, fx: Effects) -> None:
    total = len(run.workers)
    ready = sum(1 for w in run.workers if w.ready)
    sentence = (
        f"Gang requeued: {ready} of {total} ready after {format_duration(BARRIER_TIMEOUT)} "
        "at the barrier"
    )
    run.reason, run.cause = sentence, None
    stop_gang(run, Cause.BARRIER, None, f"Stopping: {sentence}", at, fx)


def machine_lost(
    run: RunView,
    machine_id: int,
    silent_since: datetime,
    at: datetime,
    fx: Effects,
    log_tails: Mapping[int, str] | None = None,
) -> None:
    """Every worker on a lost machine fails with the seed's sentence, when the machine went
    silent (its last contact, ``silent_since``), not when its lease was found expired (``at``):
    from then it was lost and still holding its GPUs (failure, held), until now, when they are
    let go. Each keeps its failure snapshot, with the last lines the server had of it
    (``log_tails``, by worker id; its agent, if it comes back, sends its own:
    lifecycle.service.late_snapshot). The gang follows."""
    lost = [
        (w, _lost_at(run, w, silent_since, at))
        for w in run.workers
        if w.machine_id == machine_id and w.alive
    ]
    for w, when in lost:
        tail = (log_tails or {}).get(w.id, "")
        worker_exited(run, w, when, fx, End(EndCause.MACHINE_LOST), log_tail=tail, released_at=at)


def _lost_at(run: RunView, w: WorkerView, silent_since: datetime, at: datetime) -> datetime:
    """When a worker on a machine silent since ``silent_since`` was lost: then, or when it was
    placed there if that was later (its agent never heard of it), never before a state its
    agent reported, nor after ``at``. A stop the server asked
    for meanwhile does not count: it never reached the machine."""
    floor = run.placed_at if w.state == STOPPING else w.since
    return min(at, max(silent_since, floor or silent_since))


def delete(run: RunView, by: str, at: datetime, fx: Effects, *, machines: set[int]) -> None:
    """Deleted: every worker is removed, with its logs on every machine that ran it."""
    for w in run.workers:
        if w.alive:
            release_room(w)
        w.stop_cause = None
        if w.state not in ENDED_STATES or w.phase != Phase.ENDED:
            set_worker(
                fx,
                run,
                w,
                STOPPED if w.state not in ENDED_STATES else w.state,
                f"Deleted by {by}",
                Phase.ENDED,
                at,
            )
    for machine_id in sorted(machines):
        for w in run.workers:
            fx.commands.append(Command(machine_id, w.id, w.name, "delete", {}))
    run.ended_at = run.ended_at or at
    run.restart_at = None
    set_run(fx, run, DELETED, f"Deleted by {by}", at)
    fx.freed = True
