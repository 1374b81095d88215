"""How a gang stops and ends: a worker's exit and the gang's failure; a gang asked to stop
(stop_gang: what asks it is in stops.py); then its end, its restart after a backoff or its
requeue. Pure, as every lifecycle rule (lifecycle/rules.py).

When one worker fails for good the others are stopped ("the gang does not run without it")."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from backend.config import format_duration
from backend.lifecycle.progress import find_stalls
from backend.lifecycle.sentences import (
    End,
    EndCause,
    budget_exhausted_sentence,
    drained_sentence,
    end_sentence,
    idle_sentence,
    port_taken_sentence,
    preempted_sentence,
    restart_backoff,
    time_limit_sentence,
    worker_failed_sentence,
    workers_completed,
)
from backend.lifecycle.starting import is_current, refresh_run
from backend.lifecycle.states import (
    COMPLETED,
    ENDED_STATES,
    FAILED,
    PENDING,
    STOPPED,
    STOPPING,
    Cause,
    Phase,
)
from backend.lifecycle.views import (
    Command,
    Effects,
    Failed,
    RunView,
    WorkerView,
    set_run,
    set_worker,
)

RESTART_COUNT_RESET = timedelta(minutes=10)
BARRIER_TIMEOUT = timedelta(minutes=15)
# A failure snapshot keeps the last 16 KiB of output (seed L-47), whatever a machine sends.
SNAPSHOT_BYTES = 16 * 1024
# A worker whose last output says its collective lost a peer (gloo's, NCCL's and PyTorch's own
# words) most likely died of another worker's end, which can be recorded after its own: a rank
# that exits tears its connections down before its process is gone, and the rank that hears of
# it may abort sooner. Such a failure counts as this much later when the gang's first failure
# is chosen, so the rank that crashed is named, not the one that heard of it.
PEER_LOST_GRACE = timedelta(seconds=5)
PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer"
    r"|remote process exited or there was a network error|NCCL communicator was aborted"
)
SNAPSHOT_CUT = "[earlier output cut: a failure snapshot keeps the last 16 KiB]\n"


_STOPPING_PHASE = {
    Cause.OWNER: Phase.STOPPING_OWNER,
    Cause.TIME_LIMIT: Phase.STOPPING_TIME_LIMIT,
    Cause.IDLE: Phase.STOPPING_IDLE,
    Cause.PREEMPTION: Phase.STOPPING_PREEMPTION,
    Cause.DRAIN: Phase.STOPPING_PREEMPTION,
    Cause.STALL: Phase.STOPPING_STALL,
    Cause.FAILURE: Phase.STOPPING_FAILURE,
    Cause.BARRIER: Phase.STOPPING_FAILURE,
}

_REQUEUED_PHASE = {
    Cause.PREEMPTION: Phase.REQUEUED_PREEMPTION,
    Cause.DRAIN: Phase.REQUEUED_PREEMPTION,
    Cause.STALL: Phase.REQUEUED_STALL,
    Cause.FAILURE: Phase.REQUEUED_FAILURE,
    Cause.BARRIER: Phase.REQUEUED_FAILURE,
    Cause.RENDEZVOUS: Phase.REQUEUED_RENDEZVOUS,
}


def release_room(w: WorkerView) -> None:
    w.machine_id, w.machine_name, w.gpu_ids, w.ready = None, None, [], False


def snapshot_output(text: str) -> str:
    """The last 16 KiB of a failure's output; a first line says when more came."""
    data = text.encode()
    if len(data) <= SNAPSHOT_BYTES:
        return text
    return SNAPSHOT_CUT + data[-SNAPSHOT_BYTES:].decode(errors="ignore")


# The ends of a process that ran: only such a one can die of a lost peer (PEER_LOST).
RAN = frozenset({EndCause.EXITED, EndCause.SIGNALLED})


def worker_exited(
    run: RunView,
    w: WorkerView,
    at: datetime,
    fx: Effects,
    end: End,
    *,
    log_tail: str = "",
    attempt: int | None = None,
    released_at: datetime | None = None,
) -> None:
    """The agent saw the worker's container end (or the machine was lost): how, ``end``.

    ``released_at``: when its GPUs are let go, where that is after its end (a lost machine's
    worker ended when the machine went silent, and held its GPUs until the loss was found)."""
    if not is_current(run, w, attempt):
        return
    if end.cause == EndCause.PORT_TAKEN and w.stop_cause is None:
        _port_taken(run, w, at, fx, end)
        return
    reason = end_sentence(end)
    exit_code = end.exit_code
    w.exit_code = exit_code
    fx.freed = True
    lost = end.cause == EndCause.MACHINE_LOST
    # Only a process that ran can have died of a lost peer: a lost machine's worker failed of
    # its machine, and one that never started failed of that, whatever lines its log still
    # held (an earlier attempt's: issue 36, a restart's rank 0 refused its MASTER_PORT and, by
    # its first attempt's "Connection closed by peer", was counted 5 s late, after its peer's
    # end that its own failure had asked for)
    peer_lost = end.cause in RAN and PEER_LOST.search(log_tail) is not None
    # a worker that never started, ended as it was asked to stop, is the stop's consequence;
    # so is a rank 0 whose port was taken while its gang was being stopped
    consequence = w.stop_cause is not None and end.cause in (
        EndCause.STOPPED_BEFORE_START,
        EndCause.PORT_TAKEN,
    )
    if w.stop_cause is not None and (
        consequence or not _failed_first(run, w, exit_code, at, peer_lost, lost)
    ):
        cause = Cause(w.stop_cause)
        stopped_for = _stop_snapshot_reason(run, w, cause)
        if stopped_for is not None:
            w.last_failure = _failure_snapshot(stopped_for[0], at, exit_code, log_tail)
            w.cause = stopped_for[1]
            if stopped_for[1] == EndCause.STALLED:
                _record_failure(w, at, EndCause.STALLED, exit_code, fx)
        sentence = _stopped_sentence(cause, run)
        _held_lost(fx, run, w, STOPPED, sentence, at, released_at)
        release_room(w)
        phase = _after_stop_phase(run, cause, at)
        set_worker(fx, run, w, STOPPED, sentence, phase, max(at, released_at or at))
    elif exit_code == 0 and run.stop_cause is None:
        release_room(w)
        set_worker(fx, run, w, COMPLETED, reason, Phase.ENDED, at)
    else:
        if run.stop_cause is None:
            find_stalls(run, at, fx)  # stalled before the failure (it too), not yet found
        w.last_failure = _failure_snapshot(reason, at, exit_code, log_tail)
        w.cause = end.cause
        machine = w.machine_name
        if not peer_lost:  # one that died of a lost peer failed of another's end, not its machine's
            _record_failure(w, at, end.cause, exit_code, fx)
        _held_lost(fx, run, w, FAILED, reason, at, released_at)
        release_room(w)
        _gang_failed(run, w, machine, reason, end.cause, at, peer_lost, fx, released_at)
    _conclude_if_done(run, _settled(run, at), fx)


def _port_taken(run: RunView, w: WorkerView, at: datetime, fx: Effects, end: End) -> None:
    """Rank 0's MASTER_PORT was held by another program on its machine (issue 37 N3): not the
    run's failure. The gang stops and is placed again at once, on the port the agent offered
    (where it held one), its restarts in a row untouched; the time the gang held its GPUs
    meanwhile counts as starting it (``_ask_to_stop``), its wait after as waiting."""
    sentence = port_taken_sentence(end.detail, w.machine_name)
    fx.freed = True
    release_room(w)
    if end.offered_port:
        run.master_port = end.offered_port
    run.reason, run.cause = sentence, EndCause.PORT_TAKEN
    run.running_since = None
    run.stop_cause = Cause.RENDEZVOUS
    set_worker(fx, run, w, STOPPED, sentence, Phase.REQUEUED_RENDEZVOUS, at)
    for other in run.workers:
        if other is not w and other.alive and other.stop_cause is None:
            _ask_to_stop(run, other, Cause.RENDEZVOUS, f"Stopping: {sentence}", at, fx)
    _conclude_if_done(run, _settled(run, at), fx)


def _held_lost(
    fx: Effects,
    run: RunView,
    w: WorkerView,
    state: str,
    reason: str,
    at: datetime,
    released_at: datetime | None,
) -> None:
    """A worker whose end comes before its GPUs are let go (its machine went silent, and was
    found lost later) is, meanwhile, lost and still holding its GPUs on that machine: the
    seed's failure, held (the GPUs were its, nobody else's, until the loss was found). A
    change recorded for it since (a stop the server asked for, which never reached it) is
    followed by its loss again, so that the time after it counts as lost too."""
    if released_at is None or released_at <= at:
        return
    recorded = w.since
    set_worker(fx, run, w, state, reason, Phase.STOPPING_FAILURE, at)
    lost = fx.transitions[-1] if fx.transitions else None
    if lost is not None and lost.worker_id == w.id and recorded is not None and recorded > at:
        fx.transitions.append(replace(lost, at=recorded))


def _record_failure(
    w: WorkerView, at: datetime, cause: EndCause, exit_code: int | None, fx: Effects
) -> None:
    """The attempt failed on its machine: kept for the machine's health (never a failure of
    a worker that was not placed)."""
    if w.machine_id is not None:
        fx.failures.append(Failed(w.id, w.machine_id, at, str(cause), exit_code))


def _failure_snapshot(
    reason: str, at: datetime, exit_code: int | None, log_tail: str
) -> dict[str, Any]:
    """The last failure snapshot (seed L-21): the reason, the time, the exit code, the last
    lines (a lost machine's come when its agent is back: lifecycle.service.late_snapshot)."""
    return {
        "reason": reason,
        "failed_at": at,
        "exit_code": exit_code,
        "log_tail": snapshot_output(log_tail),
    }


def _stop_snapshot_reason(run: RunView, w: WorkerView, cause: Cause) -> tuple[str, EndCause] | None:
    """An attempt the server ended abnormally keeps its story as a failure does (issue 20):
    at its time limit, preempted (a drain too), or stalled (the workers that stalled). An
    owner's stop, a gang torn down after another worker's failure (its log holds only the
    consequence) and a barrier's requeue do not; None. The sentence and its cause."""
    if cause == Cause.TIME_LIMIT and run.policy.time_limit is not None:
        return time_limit_sentence(run.policy.time_limit), EndCause.TIME_LIMIT
    if cause == Cause.PREEMPTION:
        return preempted_sentence(run.stop_by or "…"), EndCause.PREEMPTED
    if cause == Cause.DRAIN:
        return drained_sentence(run.stop_by or "…"), EndCause.PREEMPTED
    timeout = run.policy.stall_timeout
    if cause == Cause.STALL and w.stalled_since is not None and timeout is not None:
        return f"Stalled: no progress for {format_duration(timeout)}", EndCause.STALLED
    return None


def _settled(run: RunView, at: datetime) -> datetime:
    """When the gang's news up to an exit at ``at`` is all in: an exit reported late (rank 0
    exited at .246, after rank 1's exit at .376 had stopped the gang) is recorded at its own
    time, ordered before the stop, but what follows for the gang (its end, its requeue)
    follows the latest transition already recorded of any of its workers."""
    return max([at, *(w.since for w in run.workers if w.since is not None)])


def _failed_first(
    run: RunView,
    w: WorkerView,
    exit_code: int | None,
    at: datetime,
    peer_lost: bool,
    lost: bool = False,
) -> bool:
    """A worker torn down after another's failure may have failed earlier itself: the rank
    that crashed first is often reported last, after the others died of its absence. A worker
    whose machine went silent (``lost``) before it was asked to stop failed first too: the
    stop never reached it (two ranks on the machine both fail of it, each with its snapshot)."""
    if lost and w.state == STOPPING and w.since is not None and w.since >= at:
        return True
    first = run.first_failure
    return (
        w.stop_cause == Cause.FAILURE
        and exit_code != 0
        and first is not None
        and _precedes(at, peer_lost, first)
    )


def _precedes(at: datetime, peer_lost: bool, first: dict[str, Any]) -> bool:
    """Whether a failure at ``at`` comes before the gang's first so far: by when each ended, a
    failure that heard of a lost peer counted PEER_LOST_GRACE later."""

    def order(when: datetime, lost: bool) -> datetime:
        return when + PEER_LOST_GRACE if lost else when

    return order(at, peer_lost) < order(first["at"], bool(first.get("peer_lost")))


def _gang_failed(
    run: RunView,
    w: WorkerView,
    machine: str | None,
    reason: str,
    cause: EndCause,
    at: datetime,
    peer_lost: bool,
    fx: Effects,
    released_at: datetime | None = None,
) -> None:
    earliest = run.first_failure is None or _precedes(at, peer_lost, run.first_failure)
    if earliest:
        run.first_failure = {
            "worker": w.name,
            "machine": machine,
            "reason": reason,
            "cause": str(cause),
            "at": at,
            "peer_lost": peer_lost,
        }
    if run.stop_cause is None:
        stop_running(run, at)
        run.stop_cause = Cause.FAILURE
        for other in run.workers:
            if other is not w and other.alive and other.stop_cause is None:
                _ask_to_stop(run, other, Cause.FAILURE, f"Stopping: worker {w.name} failed", at, fx)
    failure = run.first_failure
    assert failure is not None
    phase = _after_stop_phase(run, Cause(run.stop_cause), at)
    set_worker(fx, run, w, FAILED, reason, phase, max(at, released_at or at))
    if run.stop_cause == Cause.FAILURE:
        sentence = worker_failed_sentence(failure["worker"], failure["machine"], failure["reason"])
        run.reason, run.cause = sentence, failure.get("cause")


def _ask_to_stop(
    run: RunView, w: WorkerView, cause: Cause, reason: str, at: datetime, fx: Effects
) -> None:
    w.stop_cause = cause
    assert w.machine_id is not None
    fx.commands.append(Command(w.machine_id, w.id, w.name, "stop", {"cause": str(cause)}))
    # a gang stopped for its rendezvous port is still being started, on its first attempt or
    # a later one: the seed's starting and restart
    placing = Phase.STARTING if run.attempt <= 1 else Phase.RESTART
    set_worker(fx, run, w, STOPPING, reason, _STOPPING_PHASE.get(cause, placing), at)


def _stopped_sentence(cause: Cause, run: RunView) -> str:
    if cause == Cause.IDLE:
        return idle_stopped_sentence(run)
    return {
        Cause.OWNER: f"Stopped by {run.stop_by}",
        Cause.TIME_LIMIT: "Stopped at its time limit",
        Cause.PREEMPTION: f"Stopped: {preempted_sentence(run.stop_by or '…')}",
        Cause.DRAIN: f"Stopped: {drained_sentence(run.stop_by or '…')}",
        Cause.STALL: "Stopped: it stalled",
        Cause.FAILURE: "Stopped: its gang failed",
        Cause.BARRIER: "Stopped: its gang did not start together",
        Cause.RENDEZVOUS: "Stopped: its gang's MASTER_PORT was another program's",
    }[cause]


# The stops that end the run whatever came before: none after them decides otherwise.
ENDING_CAUSES = frozenset({Cause.OWNER, Cause.TIME_LIMIT, Cause.IDLE})


def idle_stopped_sentence(run: RunView) -> str:
    """``Stopped — idle: GPU utilization under 5% for 30 min`` (issue 41)."""
    rule = run.policy.idle
    assert rule is not None, "only a run with an idle policy is stopped by it"
    return f"Stopped — {idle_sentence(rule.below, rule.window)}"


def will_restart(run: RunView, cause: Cause, at: datetime) -> bool:
    if cause in (Cause.PREEMPTION, Cause.DRAIN, Cause.BARRIER, Cause.RENDEZVOUS):
        return True
    if cause in ENDING_CAUSES:
        return False
    if run.policy.restart_policy == "never":
        return False
    return _failures_counted(run, at) < run.policy.max_restarts


def _failures_counted(run: RunView, at: datetime) -> int:
    """Restarts in a row; ten minutes of running with every worker up resets the count."""
    if run.running_since is not None and at - run.running_since >= RESTART_COUNT_RESET:
        return 0
    return run.failures_in_row


def stop_running(run: RunView, at: datetime) -> None:
    """A failure or a stall stops the gang running whole: the time it ran until now may reset
    the count, the time its workers then take to wind down must not (nor decide it twice)."""
    run.failures_in_row = _failures_counted(run, at)
    run.running_since = None


def _after_stop_phase(run: RunView, cause: Cause, at: datetime) -> Phase:
    """A worker that stopped waits to be placed again (not held) or has ended."""
    return _REQUEUED_PHASE[cause] if will_restart(run, cause, at) else Phase.ENDED


def _conclude_if_done(run: RunView, at: datetime, fx: Effects) -> None:
    if any(w.alive for w in run.workers):
        if run.stop_cause is None:
            refresh_run(run, at, fx)
        return
    if run.stop_cause is None:
        if all(w.state == COMPLETED for w in run.workers):
            run.ended_at = at
            n = len(run.workers)
            set_run(fx, run, COMPLETED, workers_completed(n), at)
        return
    cause = Cause(run.stop_cause)
    if cause == Cause.OWNER:
        end_run(run, STOPPED, f"Stopped by {run.stop_by}", at, fx)
    elif cause == Cause.TIME_LIMIT:
        assert run.policy.time_limit is not None
        sentence = time_limit_sentence(run.policy.time_limit)
        end_run(run, FAILED, sentence, at, fx, EndCause.TIME_LIMIT)
    elif cause == Cause.IDLE:
        end_run(run, STOPPED, idle_stopped_sentence(run), at, fx, EndCause.IDLE)
    elif cause in (Cause.PREEMPTION, Cause.DRAIN, Cause.BARRIER, Cause.RENDEZVOUS):
        _requeue(run, cause, run.reason, None, at, fx, run.cause)
    else:
        _restart_or_fail(run, cause, at, fx)


def _failure_sentence(run: RunView) -> tuple[str, str | None]:
    """The sentence of the gang's first failure and its cause."""
    failure = run.first_failure
    if failure is None:
        return run.reason, run.cause
    sentence = worker_failed_sentence(failure["worker"], failure["machine"], failure["reason"])
    return sentence, failure.get("cause")


def _restart_or_fail(run: RunView, cause: Cause, at: datetime, fx: Effects) -> None:
    why: EndCause | str | None
    if cause == Cause.STALL:
        sentence, why = run.reason, EndCause.STALLED
    else:
        sentence, why = _failure_sentence(run)
    if run.policy.restart_policy == "never":
        end_run(run, FAILED, sentence, at, fx, why)
        return
    counted = _failures_counted(run, at)
    if counted >= run.policy.max_restarts:
        if run.policy.max_restarts:
            sentence, why = (
                budget_exhausted_sentence(run.policy.max_restarts),
                EndCause.RETRY_BUDGET,
            )
        end_run(run, FAILED, sentence, at, fx, why)
        return
    run.failures_in_row = counted + 1
    wait = restart_backoff(run.failures_in_row)
    restart_at = at + wait
    count = f"{run.failures_in_row}/{run.policy.max_restarts}"
    reason = f"Restarting in {format_duration(wait)} ({count}): {sentence}"
    _requeue(run, cause, reason, restart_at, at, fx, why)


def _requeue(
    run: RunView,
    cause: Cause,
    reason: str,
    restart_at: datetime | None,
    at: datetime,
    fx: Effects,
    why: EndCause | str | None,
) -> None:
    run.stop_cause = run.stop_by = None
    run.running_since = None
    run.placed_at = None
    run.restart_at = restart_at
    phase = _REQUEUED_PHASE[cause]
    for w in run.workers:
        release_room(w)
        w.stop_cause = None
        w.restart_at = restart_at
        # Counted when decided, as the run's restarts in a row are (its reason's "(1/10)", the
        # Restarting in a loop panel): a worker waiting for its restart has made it (issue 36:
        # the panel said 1 where the worker said 0 until it was placed again). A gang whose
        # rendezvous port was another program's restarts nothing: it never started together.
        if cause != Cause.RENDEZVOUS:
            w.restarts += 1
        worker_reason = f"Waiting to be placed again: {reason}"
        set_worker(fx, run, w, PENDING, worker_reason, phase, at)
    set_run(fx, run, PENDING, reason, at, why)
    fx.freed = True


def end_run(
    run: RunView,
    state: str,
    reason: str,
    at: datetime,
    fx: Effects,
    why: EndCause | str | None = None,
) -> None:
    run.ended_at = at
    run.restart_at = None
    for w in run.workers:
        w.stop_cause = None
        w.restart_at = None
        if w.state not in ENDED_STATES:
            set_worker(fx, run, w, STOPPED, f"Stopped: the run {state.lower()}", Phase.ENDED, at)
        elif w.phase != Phase.ENDED:
            set_worker(fx, run, w, w.state, w.reason, Phase.ENDED, at)
    set_run(fx, run, state, reason, at, why)


def stop_gang(
    run: RunView, cause: Cause, by: str | None, worker_reason: str, at: datetime, fx: Effects
) -> None:
    """Ask every placed worker to wind down; the gang ends or requeues once all are gone."""
    if run.ended or run.stop_cause in ENDING_CAUSES:
        return
    if run.stop_cause is None:
        find_stalls(run, at, fx)  # stalled before the stop, not yet found: from their progress
        # the time it ran until now may reset its restarts in a row, as a failure's stop does:
        # a run preempted after 10 minutes running is not restarting in a loop (issue 36)
        stop_running(run, at)
    run.stop_cause, run.stop_by = cause, by
    for w in run.workers:
        if w.alive and w.stop_cause is None:
            _ask_to_stop(run, w, cause, worker_reason, at, fx)
        elif w.alive:
            w.stop_cause = cause  # already stopping: the later, stronger cause decides the end
    _conclude_if_done(run, at, fx)
