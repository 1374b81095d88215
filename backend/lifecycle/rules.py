"""How a run and its workers move through their lives, and the sentence that explains each step.

Pure: plain dataclasses in, the same dataclasses changed and a list of effects out. No database,
no clock: every function is told the time. The service loads the views, calls a rule, and
writes back what changed together with the transitions and agent commands recorded here.

A run is a gang: its workers are placed together, start together at a barrier, and when one
fails for good the others are stopped ("the gang does not run without it").
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from backend.config import format_duration
from backend.runs.rules import RunState, Wait, WorkerState

RESTART_BASE = timedelta(seconds=10)
RESTART_CAP = timedelta(minutes=5)
RESTART_COUNT_RESET = timedelta(minutes=10)
BARRIER_TIMEOUT = timedelta(minutes=15)
# A straggler: a gang member at under half its gang's median pace for three minutes or more.
STRAGGLER_PACE = 0.5
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
STRAGGLER_AFTER = timedelta(minutes=3)


class Phase(StrEnum):
    """Where a worker's GPU time goes now; goodput accounting reads the phases' intervals."""

    WAITING = "waiting"  # waiting for its first placement
    STARTING = "starting"  # placed, not yet running, first attempt
    RESTART = "restart"  # the same on a later attempt
    RUNNING = "running"  # productive or idle, by its GPUs' utilisation
    STALLED = "stalled"  # running while stalled, from its last progress
    STOPPING_OWNER = "stopping:owner"  # winding down when its owner asked
    STOPPING_TIME_LIMIT = "stopping:time_limit"  # winding down at its time limit
    STOPPING_PREEMPTION = "stopping:preemption"
    STOPPING_STALL = "stopping:stall"
    STOPPING_FAILURE = "stopping:failure"  # torn down with its gang after a failure
    REQUEUED_FAILURE = "requeued:failure"  # waiting to be placed again after a failure
    REQUEUED_PREEMPTION = "requeued:preemption"
    REQUEUED_STALL = "requeued:stall"
    ENDED = "ended"


HELD_PHASES = frozenset(
    {
        Phase.STARTING,
        Phase.RESTART,
        Phase.RUNNING,
        Phase.STALLED,
        Phase.STOPPING_OWNER,
        Phase.STOPPING_TIME_LIMIT,
        Phase.STOPPING_PREEMPTION,
        Phase.STOPPING_STALL,
        Phase.STOPPING_FAILURE,
    }
)


class Cause(StrEnum):
    """Why a gang is being stopped."""

    OWNER = "owner"
    TIME_LIMIT = "time_limit"
    PREEMPTION = "preemption"  # stop_by: the run it makes room for
    DRAIN = "drain"  # a preemption by a drain; stop_by: the machine drained
    STALL = "stall"
    FAILURE = "failure"
    BARRIER = "barrier"


_STOPPING_PHASE = {
    Cause.OWNER: Phase.STOPPING_OWNER,
    Cause.TIME_LIMIT: Phase.STOPPING_TIME_LIMIT,
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
}

# The states, by their names in runs/rules.py (a run's are a worker's but Stopping, plus Deleted).
PENDING = WorkerState.PENDING.value
PREPARING = WorkerState.PREPARING.value
PULLING = WorkerState.PULLING.value
STARTING = WorkerState.STARTING.value
RUNNING = WorkerState.RUNNING.value
STOPPING = WorkerState.STOPPING.value
COMPLETED = WorkerState.COMPLETED.value
FAILED = WorkerState.FAILED.value
STOPPED = WorkerState.STOPPED.value
DELETED = RunState.DELETED.value

PLACED_STATES = frozenset({PREPARING, PULLING, STARTING, RUNNING, STOPPING})
ENDED_STATES = frozenset({COMPLETED, FAILED, STOPPED, DELETED})
# A worker's attempt has ended: it holds nothing more until it is placed again.
WORKER_ENDED_STATES = frozenset({COMPLETED, FAILED, STOPPED})


def may_follow(state: str, next_state: str, *, placing: bool = False) -> bool:
    """Terminal states are terminal: a worker that completed, failed or stopped takes no
    further transition of its attempt. It may only wait to be placed again (Pending), keep
    its state while its run ends or is deleted (its phase becomes ended), or start a new
    attempt (``placing``). A stop, a report or a timer that comes after its end changes
    nothing (issue 19: a gang stop recorded after a worker's own failure held it forever)."""
    if placing or state not in WORKER_ENDED_STATES:
        return True
    return next_state in (state, PENDING)


# The seed's sentences.
OOM_KILLED = "OOMKilled: the container exceeded its memory limit"
MACHINE_LOST = "Machine lost: its lease expired"
CONTAINER_RUNNING = "Container running"
WAITING_FOR_ROOM = "Waiting for room for all its workers at once"
LOST = "Lost: its process ended while the agent was away"
LOST_BEFORE_START = "Lost: its container never started"
STOPPED_BEFORE_START = "Stopped before it started"


class EndCause(StrEnum):
    """Why a worker's attempt ended, or a run failed, restarts or was preempted: stored beside
    the sentence (workers.cause, runs.cause), which is written from it; failures are
    classified by it, never by their sentence (runs/failures.py)."""

    # As the worker's machine saw it (proto EndCause).
    EXITED = "exited"
    OOM_KILLED = "oom_killed"
    SIGNALLED = "signalled"
    NOT_FOUND = "not_found"
    LOST = "lost"
    LOST_BEFORE_START = "lost_before_start"
    IMAGE_PULL = "image_pull"
    NOT_STARTED = "not_started"
    STOPPED_BEFORE_START = "stopped_before_start"
    # As the server found it.
    MACHINE_LOST = "machine_lost"
    LOST_BY_AGENT = "lost_by_agent"
    GPU_FAULT = "gpu_fault"
    UNDELIVERABLE = "undeliverable"
    STALLED = "stalled"
    TIME_LIMIT = "time_limit"
    PREEMPTED = "preempted"
    RETRY_BUDGET = "retry_budget"


@dataclass(frozen=True)
class End:
    """How a worker's attempt ended: the cause and its facts. ``detail`` is what the machine
    alone knows (the engine's words on a pull, why it could not start) or the server's own
    sentence for the ends it finds itself (a GPU fault, an undeliverable command)."""

    cause: EndCause
    exit_code: int | None = None
    signal: int | None = None
    detail: str = ""


def exited_with(code: int) -> str:
    return f"Exited with code {code}"


def end_sentence(end: End) -> str:
    """The sentence people read for an end (seed: "Exited with code 1", "OOMKilled: …")."""
    fixed = {
        EndCause.OOM_KILLED: OOM_KILLED,
        EndCause.MACHINE_LOST: MACHINE_LOST,
        EndCause.LOST: LOST,
        EndCause.LOST_BEFORE_START: LOST_BEFORE_START,
        EndCause.STOPPED_BEFORE_START: STOPPED_BEFORE_START,
    }
    if end.cause in fixed:
        return fixed[end.cause]
    if end.cause == EndCause.IMAGE_PULL:
        return f"ErrImagePull: {end.detail}"
    if end.cause in (EndCause.EXITED, EndCause.SIGNALLED, EndCause.NOT_FOUND):
        return exited_with(end.exit_code if end.exit_code is not None else -1)
    return end.detail


def waiting_sentence(wait: Wait, name: str, done: str = "") -> str:
    """What a preparing or pulling worker waits for, in the seed's words (L-64, L-65), from
    what its agent reported: the name of the secret, drive or image, and how far a pull is."""
    if wait == Wait.SECRET:
        return f"waiting for external secret {name}"
    if wait == Wait.DRIVE:
        return f"Waiting for drive {name} to be filled"
    if wait == Wait.IMAGE:
        return f"Pulling image {name}: {done}" if done else f"Pulling image {name}"
    raise ValueError(f"a worker's agent does not report waiting for {wait}")


def starting_together(ready: int, total: int) -> str:
    return f"Starting together: {ready} of {total} ready"


def workers_running(running: int, total: int) -> str:
    return f"{running} of {total} workers running"


def worker_failed_sentence(worker: str, machine: str | None, reason: str) -> str:
    where = f" on {machine}" if machine else ""
    return f"Worker {worker} failed{where}: {reason}; the gang does not run without it"


def preempted_sentence(by_run: str) -> str:
    return f"Preempted by higher-priority work ({by_run})"


def drained_sentence(machine: str) -> str:
    return f"Preempted by a drain of {machine}"


def time_limit_sentence(limit: timedelta) -> str:
    return f"Exceeded its time limit of {format_duration(limit)}"


def budget_exhausted_sentence(max_restarts: int) -> str:
    return f"Retry budget exhausted after {max_restarts}/{max_restarts} restarts"


def restart_backoff(failures_in_row: int) -> timedelta:
    """Each failure doubles the wait, from 10 seconds up to 5 minutes."""
    wait = RESTART_BASE * (2 ** max(failures_in_row - 1, 0))
    return min(wait, RESTART_CAP)


@dataclass
class WorkerView:
    id: int
    rank: int
    name: str
    gpus: int
    state: str
    reason: str
    phase: str
    machine_id: int | None = None
    machine_name: str | None = None
    gpu_ids: list[int] = field(default_factory=list)
    ready: bool = False
    stop_cause: str | None = None
    # What it waits for while preparing or pulling (a Wait), beside its reason.
    waits_for: str | None = None
    exit_code: int | None = None
    # The cause of its last failure snapshot (last_failure): its failure is classified by it.
    cause: str | None = None
    restarts: int = 0
    restart_at: datetime | None = None
    last_failure: dict[str, Any] | None = None
    progress_at: datetime | None = None
    stalled_since: datetime | None = None
    # The workload's own step counter, and how fast it moves (steps per second, smoothed).
    progress_step: int | None = None
    stepped_at: datetime | None = None
    progress_rate: float | None = None
    # Since when it has been well behind its gang's median pace.
    slow_since: datetime | None = None
    attempt: int = 0
    # Its GPUs' recent utilisation: its pace when the workload reports no progress. Written
    # by the samples' ingest, read here, never written back by the lifecycle.
    gpu_utilization: float | None = None
    # When its state last changed (its latest transition as recorded).
    since: datetime | None = None

    @property
    def placed(self) -> bool:
        return self.machine_id is not None

    @property
    def alive(self) -> bool:
        """Placed and not yet reported gone: it still holds its GPUs."""
        return self.placed and self.state in PLACED_STATES

    @property
    def held_gpus(self) -> int:
        return self.gpus if self.phase in HELD_PHASES else 0


@dataclass
class RunPolicy:
    """What the specification says about how the run starts, fails and ends."""

    restart_policy: str = "on_failure"
    max_restarts: int = 10
    time_limit: timedelta | None = None
    stall_timeout: timedelta | None = None
    on_stall: str = "restart"


@dataclass
class RunView:
    id: int
    name: str
    state: str
    reason: str
    policy: RunPolicy
    workers: list[WorkerView]
    attempt: int = 0
    failures_in_row: int = 0
    restart_at: datetime | None = None
    started_at: datetime | None = None
    running_since: datetime | None = None
    placed_at: datetime | None = None
    ended_at: datetime | None = None
    stop_cause: str | None = None
    stop_by: str | None = None
    # What it waits for while pending (the scheduler's) or preparing (its slowest worker's).
    waits_for: str | None = None
    # Why it failed, restarts or was preempted while its reason says so (an EndCause).
    cause: str | None = None
    first_failure: dict[str, Any] | None = None
    master_port: int | None = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def placed(self) -> bool:
        return any(w.placed for w in self.workers)

    def worker(self, name: str) -> WorkerView:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(name)


@dataclass(frozen=True)
class Transition:
    """One recorded change: a run's (worker_id None) or a worker's state and phase."""

    run_id: int
    worker_id: int | None
    at: datetime
    state: str
    reason: str
    phase: str | None = None
    held_gpus: int = 0
    gpus: int = 0
    machine_id: int | None = None


@dataclass(frozen=True)
class Command:
    """What a machine's agent must do for one worker."""

    machine_id: int
    # The machine knows the worker by this id alone (names repeat across workspaces).
    worker_id: int
    worker_name: str
    kind: str  # start | release | stop | delete
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class Effects:
    transitions: list[Transition] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    # Runs that gave room back: the scheduler should look again.
    freed: bool = False


@dataclass(frozen=True)
class Placement:
    machine_id: int
    machine_name: str
    gpu_ids: tuple[int, ...]


# -- recording ---------------------------------------------------------------------------------


def _set_worker(
    fx: Effects,
    run: RunView,
    w: WorkerView,
    state: str,
    reason: str,
    phase: Phase | str,
    at: datetime,
    *,
    placing: bool = False,
    waits: str | None = None,
) -> None:
    if not may_follow(w.state, state, placing=placing):
        return
    changed = (w.state, w.phase) != (state, str(phase))
    w.state, w.reason, w.phase, w.waits_for = state, reason, str(phase), waits
    if changed:
        if w.since is None or at > w.since:
            w.since = at
        fx.transitions.append(
            Transition(
                run_id=run.id,
                worker_id=w.id,
                at=at,
                state=state,
                reason=reason,
                phase=str(phase),
                held_gpus=w.held_gpus,
                gpus=w.gpus,
                machine_id=w.machine_id,
            )
        )


def _set_run(
    fx: Effects,
    run: RunView,
    state: str,
    reason: str,
    at: datetime,
    cause: EndCause | str | None = None,
    *,
    waits: str | None = None,
) -> None:
    changed = run.state != state
    run.state, run.reason, run.cause, run.waits_for = state, reason, cause, waits
    if changed:
        fx.transitions.append(
            Transition(run_id=run.id, worker_id=None, at=at, state=state, reason=reason)
        )


def _release_room(w: WorkerView) -> None:
    w.machine_id, w.machine_name, w.gpu_ids, w.ready = None, None, [], False


# -- placing and starting ----------------------------------------------------------------------


def place(
    run: RunView,
    placements: list[Placement],
    at: datetime,
    fx: Effects,
    *,
    master_port: int,
    start_payload: dict[str, Any],
    master_addr: str | None = None,
) -> None:
    """Put every worker of the gang on its machine at once and tell the agents to start them.
    ``master_addr`` is where the other machines reach rank 0's (its agent's advertised
    address); without one, its machine's name."""
    assert len(placements) == len(run.workers), "a gang is placed whole or not at all"
    run.attempt += 1
    run.placed_at = at
    run.restart_at = None
    run.first_failure = None
    run.stop_cause = run.stop_by = None
    run.running_since = None
    run.master_port = master_port
    phase = Phase.STARTING if run.attempt == 1 else Phase.RESTART
    master_addr = master_addr or placements[0].machine_name
    for w, p in zip(sorted(run.workers, key=lambda w: w.rank), placements, strict=True):
        w.machine_id, w.machine_name, w.gpu_ids = p.machine_id, p.machine_name, list(p.gpu_ids)
        w.ready, w.exit_code, w.stop_cause, w.restart_at = False, None, None, None
        w.stalled_since, w.progress_at = None, None
        w.progress_step = w.stepped_at = w.progress_rate = w.slow_since = None
        w.attempt = run.attempt
        if run.attempt > 1:
            w.restarts += 1
        _set_worker(
            fx, run, w, STARTING, f"Placed on {p.machine_name}; starting", phase, at, placing=True
        )
        environment = {
            "RANK": str(w.rank),
            "WORLD_SIZE": str(len(run.workers)),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in p.gpu_ids),
            "ASTRAEUS_RUN": run.name,
            "ASTRAEUS_WORKER": w.name,
        }
        fx.commands.append(
            Command(
                machine_id=p.machine_id,
                worker_id=w.id,
                worker_name=w.name,
                kind="start",
                payload={
                    **start_payload,
                    "run": run.name,
                    "rank": w.rank,
                    "attempt": run.attempt,
                    "gpu_ids": list(p.gpu_ids),
                    "astraeus_environment": environment,
                },
            )
        )
    _set_run(fx, run, STARTING, starting_together(0, len(run.workers)), at)


def _refresh_run(run: RunView, at: datetime, fx: Effects) -> None:
    """A placed gang's state follows its slowest worker; all running makes the run Running."""
    if run.stop_cause is not None or run.ended:
        return
    workers = run.workers
    total = len(workers)
    running = sum(1 for w in workers if w.state == RUNNING)
    if running == total:
        if run.running_since is None:
            run.running_since = at
        if run.started_at is None:
            run.started_at = at
        _set_run(fx, run, RUNNING, workers_running(running, total), at)
        return
    for state in (PREPARING, PULLING):
        slow = next((w for w in workers if w.state == state), None)
        if slow is not None:
            _set_run(fx, run, state, slow.reason, at, waits=slow.waits_for)
            return
    if running and run.state == RUNNING:
        _set_run(fx, run, RUNNING, workers_running(running, total), at)
        return
    ready = sum(1 for w in workers if w.ready or w.state == RUNNING)
    _set_run(fx, run, STARTING, starting_together(ready, total), at)


def _current(run: RunView, w: WorkerView, attempt: int | None) -> bool:
    """A report about an earlier attempt, or a worker no longer placed, changes nothing."""
    return w.alive and (attempt is None or attempt == run.attempt)


def worker_preparing(
    run: RunView,
    w: WorkerView,
    state: str,
    reason: str,
    at: datetime,
    fx: Effects,
    *,
    attempt: int | None = None,
    waits: Wait | None = None,
) -> None:
    """The agent is preparing (credentials, drives) or pulling the image; the reason says what,
    ``waits`` (when its agent said it) what kind of thing it is."""
    assert state in (PREPARING, PULLING, STARTING)
    if not _current(run, w, attempt) or w.stop_cause or w.ready or w.state == RUNNING:
        return  # late news: it is already past preparing and pulling
    _set_worker(fx, run, w, state, reason, w.phase, at, waits=waits)
    _refresh_run(run, at, fx)


def worker_ready(
    run: RunView, w: WorkerView, at: datetime, fx: Effects, *, attempt: int | None = None
) -> None:
    """Prepared and pulled: at the gang barrier. When all are, every agent is told to go."""
    if not _current(run, w, attempt) or w.stop_cause or w.ready:
        return
    w.ready = True
    _set_worker(fx, run, w, STARTING, "Ready; waiting for the rest of its gang", w.phase, at)
    if all(x.ready for x in run.workers):
        for x in run.workers:
            assert x.machine_id is not None
            fx.commands.append(
                Command(x.machine_id, x.id, x.name, "release", {"attempt": run.attempt})
            )
    _refresh_run(run, at, fx)


def worker_running(
    run: RunView, w: WorkerView, at: datetime, fx: Effects, *, attempt: int | None = None
) -> None:
    if not _current(run, w, attempt) or w.stop_cause or w.state == RUNNING:
        return  # a repeat (an agent reconnecting) is neither news nor progress
    w.ready = True
    w.progress_at = at
    _set_worker(fx, run, w, RUNNING, CONTAINER_RUNNING, Phase.RUNNING, at)
    _refresh_run(run, at, fx)


def worker_progress(
    run: RunView, w: WorkerView, at: datetime, fx: Effects, *, step: int | None = None
) -> None:
    """A progress report or a new log line: not stalled (any more); with a step, its pace.

    A worker whose workload reports its steps (this attempt) makes progress by its steps
    alone: a gang that only prints while it waits (rendezvous retries, NCCL warnings) is
    found stalled all the same."""
    if w.state != RUNNING or w.stop_cause:
        return
    if step is None and w.progress_step is not None:
        return  # it reports its steps: output alone (a retry warning a second) is no progress
    if step is not None:
        _measure_pace(w, step, at)
    if w.progress_at is None or at > w.progress_at:
        w.progress_at = at
    if w.stalled_since is not None:
        w.stalled_since = None
        _set_worker(fx, run, w, RUNNING, CONTAINER_RUNNING, Phase.RUNNING, at)


def _measure_pace(w: WorkerView, step: int, at: datetime) -> None:
    previous_step, previous_at = w.progress_step, w.stepped_at
    if previous_step is not None and previous_at is not None and at > previous_at:
        pace = max(step - previous_step, 0) / (at - previous_at).total_seconds()
        w.progress_rate = pace if w.progress_rate is None else (w.progress_rate + pace) / 2
    if previous_at is None or at > previous_at:
        w.progress_step, w.stepped_at = step, at


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


# -- endings -----------------------------------------------------------------------------------


def snapshot_output(text: str) -> str:
    """The last 16 KiB of a failure's output; a first line says when more came."""
    data = text.encode()
    if len(data) <= SNAPSHOT_BYTES:
        return text
    return SNAPSHOT_CUT + data[-SNAPSHOT_BYTES:].decode(errors="ignore")


def worker_exited(
    run: RunView,
    w: WorkerView,
    at: datetime,
    fx: Effects,
    end: End,
    *,
    log_tail: str = "",
    attempt: int | None = None,
) -> None:
    """The agent saw the worker's container end (or the machine was lost): how, ``end``."""
    if not _current(run, w, attempt):
        return
    reason = end_sentence(end)
    exit_code = end.exit_code
    w.exit_code = exit_code
    fx.freed = True
    peer_lost = PEER_LOST.search(log_tail) is not None
    if w.stop_cause is not None and not _failed_first(run, w, exit_code, at, peer_lost):
        cause = Cause(w.stop_cause)
        stopped_for = _stop_snapshot_reason(run, w, cause)
        if stopped_for is not None:
            w.last_failure = _failure_snapshot(stopped_for[0], at, exit_code, log_tail)
            w.cause = stopped_for[1]
        _release_room(w)
        phase = _after_stop_phase(run, cause, at)
        _set_worker(fx, run, w, STOPPED, _stopped_sentence(cause, run), phase, at)
    elif exit_code == 0 and run.stop_cause is None:
        _release_room(w)
        _set_worker(fx, run, w, COMPLETED, reason, Phase.ENDED, at)
    else:
        if run.stop_cause is None:
            _find_stalls(run, at, fx)  # stalled before the failure (it too), not yet found
        w.last_failure = _failure_snapshot(reason, at, exit_code, log_tail)
        w.cause = end.cause
        machine = w.machine_name
        _release_room(w)
        _gang_failed(run, w, machine, reason, end.cause, at, peer_lost, fx)
    _conclude_if_done(run, _settled(run, at), fx)


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
    run: RunView, w: WorkerView, exit_code: int | None, at: datetime, peer_lost: bool
) -> bool:
    """A worker torn down after another's failure may have failed earlier itself: the rank
    that crashed first is often reported last, after the others died of its absence."""
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
        _stop_running(run, at)
        run.stop_cause = Cause.FAILURE
        for other in run.workers:
            if other is not w and other.alive and other.stop_cause is None:
                _ask_to_stop(run, other, Cause.FAILURE, f"Stopping: worker {w.name} failed", at, fx)
    failure = run.first_failure
    assert failure is not None
    _set_worker(fx, run, w, FAILED, reason, _after_stop_phase(run, Cause(run.stop_cause), at), at)
    if run.stop_cause == Cause.FAILURE:
        sentence = worker_failed_sentence(failure["worker"], failure["machine"], failure["reason"])
        run.reason, run.cause = sentence, failure.get("cause")


def _ask_to_stop(
    run: RunView, w: WorkerView, cause: Cause, reason: str, at: datetime, fx: Effects
) -> None:
    w.stop_cause = cause
    assert w.machine_id is not None
    fx.commands.append(Command(w.machine_id, w.id, w.name, "stop", {"cause": str(cause)}))
    _set_worker(fx, run, w, STOPPING, reason, _STOPPING_PHASE[cause], at)


def _stopped_sentence(cause: Cause, run: RunView) -> str:
    return {
        Cause.OWNER: f"Stopped by {run.stop_by}",
        Cause.TIME_LIMIT: "Stopped at its time limit",
        Cause.PREEMPTION: f"Stopped: {preempted_sentence(run.stop_by or '…')}",
        Cause.DRAIN: f"Stopped: {drained_sentence(run.stop_by or '…')}",
        Cause.STALL: "Stopped: it stalled",
        Cause.FAILURE: "Stopped: its gang failed",
        Cause.BARRIER: "Stopped: its gang did not start together",
    }[cause]


def _will_restart(run: RunView, cause: Cause, at: datetime) -> bool:
    if cause in (Cause.PREEMPTION, Cause.DRAIN, Cause.BARRIER):
        return True
    if cause in (Cause.OWNER, Cause.TIME_LIMIT):
        return False
    if run.policy.restart_policy == "never":
        return False
    return _failures_counted(run, at) < run.policy.max_restarts


def _failures_counted(run: RunView, at: datetime) -> int:
    """Restarts in a row; ten minutes of running with every worker up resets the count."""
    if run.running_since is not None and at - run.running_since >= RESTART_COUNT_RESET:
        return 0
    return run.failures_in_row


def _stop_running(run: RunView, at: datetime) -> None:
    """A failure or a stall stops the gang running whole: the time it ran until now may reset
    the count, the time its workers then take to wind down must not (nor decide it twice)."""
    run.failures_in_row = _failures_counted(run, at)
    run.running_since = None


def _after_stop_phase(run: RunView, cause: Cause, at: datetime) -> Phase:
    """A worker that stopped waits to be placed again (not held) or has ended."""
    return _REQUEUED_PHASE[cause] if _will_restart(run, cause, at) else Phase.ENDED


def _conclude_if_done(run: RunView, at: datetime, fx: Effects) -> None:
    if any(w.alive for w in run.workers):
        if run.stop_cause is None:
            _refresh_run(run, at, fx)
        return
    if run.stop_cause is None:
        if all(w.state == COMPLETED for w in run.workers):
            run.ended_at = at
            n = len(run.workers)
            _set_run(fx, run, COMPLETED, f"{n} of {n} workers completed", at)
        return
    cause = Cause(run.stop_cause)
    if cause == Cause.OWNER:
        _end(run, STOPPED, f"Stopped by {run.stop_by}", at, fx)
    elif cause == Cause.TIME_LIMIT:
        assert run.policy.time_limit is not None
        sentence = time_limit_sentence(run.policy.time_limit)
        _end(run, FAILED, sentence, at, fx, EndCause.TIME_LIMIT)
    elif cause in (Cause.PREEMPTION, Cause.DRAIN, Cause.BARRIER):
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
        _end(run, FAILED, sentence, at, fx, why)
        return
    counted = _failures_counted(run, at)
    if counted >= run.policy.max_restarts:
        if run.policy.max_restarts:
            sentence, why = (
                budget_exhausted_sentence(run.policy.max_restarts),
                EndCause.RETRY_BUDGET,
            )
        _end(run, FAILED, sentence, at, fx, why)
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
        _release_room(w)
        w.stop_cause = None
        w.restart_at = restart_at
        worker_reason = f"Waiting to be placed again: {reason}"
        _set_worker(fx, run, w, PENDING, worker_reason, phase, at)
    _set_run(fx, run, PENDING, reason, at, why)
    fx.freed = True


def _end(
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
            _set_worker(fx, run, w, STOPPED, f"Stopped: the run {state.lower()}", Phase.ENDED, at)
        elif w.phase != Phase.ENDED:
            _set_worker(fx, run, w, w.state, w.reason, Phase.ENDED, at)
    _set_run(fx, run, state, reason, at, why)


def _stop_gang(
    run: RunView, cause: Cause, by: str | None, worker_reason: str, at: datetime, fx: Effects
) -> None:
    """Ask every placed worker to wind down; the gang ends or requeues once all are gone."""
    if run.ended or run.stop_cause in (Cause.OWNER, Cause.TIME_LIMIT):
        return
    if run.stop_cause is None:
        _find_stalls(run, at, fx)  # stalled before the stop, not yet found: from their progress
    run.stop_cause, run.stop_by = cause, by
    for w in run.workers:
        if w.alive and w.stop_cause is None:
            _ask_to_stop(run, w, cause, worker_reason, at, fx)
        elif w.alive:
            w.stop_cause = cause  # already stopping: the later, stronger cause decides the end
    _conclude_if_done(run, at, fx)


def stop(run: RunView, by: str, at: datetime, fx: Effects) -> None:
    """Its owner asked: wind down (counted productive), then Stopped."""
    run.reason, run.cause = f"Stopping: asked by {by}", None
    _stop_gang(run, Cause.OWNER, by, f"Stopping: asked by {by}", at, fx)


def time_limit_reached(run: RunView, at: datetime, fx: Effects) -> None:
    assert run.policy.time_limit is not None
    sentence = time_limit_sentence(run.policy.time_limit)
    run.reason, run.cause = f"Stopping: {sentence.lower()}", None
    _stop_gang(
        run,
        Cause.TIME_LIMIT,
        None,
        f"Stopping: the run {sentence[0].lower()}{sentence[1:]}",
        at,
        fx,
    )


def preempt(run: RunView, by_run: str, at: datetime, fx: Effects) -> None:
    """Stop for higher-priority work; the run is queued again, not failed."""
    if run.stop_cause is not None:
        return  # already winding down: its own cause (a failure to count, an owner) decides
    run.reason, run.cause = preempted_sentence(by_run), EndCause.PREEMPTED
    _stop_gang(run, Cause.PREEMPTION, by_run, preempted_sentence(by_run), at, fx)


def drain_preempt(run: RunView, machine: str, at: datetime, fx: Effects) -> None:
    """A machine of the gang is drained: the run stops and is queued again, like a preemption."""
    if run.stop_cause is not None:
        return  # already winding down: its own cause (a failure to count, an owner) decides
    sentence = drained_sentence(machine)
    run.reason, run.cause = sentence, EndCause.PREEMPTED
    _stop_gang(run, Cause.DRAIN, machine, sentence, at, fx)


def barrier_timed_out(run: RunView, at: datetime, fx: Effects) -> None:
    total = len(run.workers)
    ready = sum(1 for w in run.workers if w.ready)
    sentence = (
        f"Gang requeued: {ready} of {total} ready after {format_duration(BARRIER_TIMEOUT)} "
        "at the barrier"
    )
    run.reason, run.cause = sentence, None
    _stop_gang(run, Cause.BARRIER, None, f"Stopping: {sentence}", at, fx)


def machine_lost(run: RunView, machine_id: int, at: datetime, fx: Effects) -> None:
    """Every worker on a lost machine fails with the seed's sentence; the gang follows."""
    for w in run.workers:
        if w.machine_id == machine_id and w.alive:
            worker_exited(run, w, at, fx, End(EndCause.MACHINE_LOST))


# When a stall stops its gang, a member quiet for this part of the stall timeout had stopped
# too (a rank hung in a collective waits for the one that hung first): stalled from its own
# last progress. A healthy worker shows progress far more often than its stall timeout.
STALLED_WITH_GANG = 0.5


def _stalled_by(run: RunView, at: datetime, quiet_for: timedelta) -> list[WorkerView]:
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


def _mark_stalled(run: RunView, w: WorkerView, reason: str, fx: Effects) -> None:
    """Stalled from its own last progress (a transition dated back to it: the goodput tick
    recounts what it had counted since, DESIGN §4 invariant 3)."""
    assert w.progress_at is not None
    w.stalled_since = w.progress_at
    _set_worker(fx, run, w, RUNNING, reason, Phase.STALLED, w.progress_at)


def _find_stalls(run: RunView, at: datetime, fx: Effects) -> list[WorkerView]:
    """Every running worker whose progress stopped for the stall timeout is stalled, each from
    its own last progress, whatever stops the gang (a stall, a failure, a stop) first."""
    timeout = run.policy.stall_timeout
    if timeout is None:
        return []
    found = _stalled_by(run, at, timeout)
    for w in found:
        _mark_stalled(run, w, f"Stalled: no progress for {format_duration(timeout)}", fx)
    return found


def _stall_stops_gang(run: RunView, w: WorkerView, at: datetime, fx: Effects) -> None:
    """``on_stall: restart``: the gang stops because ``w`` stalled; members that had stopped
    with it are stalled from their own last progress too, not running until the stop."""
    timeout = run.policy.stall_timeout
    assert timeout is not None
    for other in _stalled_by(run, at, timeout * STALLED_WITH_GANG):
        quiet = format_duration(at - other.progress_at) if other.progress_at else "a while"
        _mark_stalled(run, other, f"Stalled with its gang: no progress for {quiet}", fx)
    quiet = format_duration(timeout)
    run.reason = f"Worker {w.name} stalled on {w.machine_name}: no progress for {quiet}"
    run.cause = None  # advice once it restarts or fails (its sentence then carries it)
    _stop_running(run, at)
    _stop_gang(run, Cause.STALL, None, f"Stopping: worker {w.name} stalled", at, fx)


def worker_stalled(run: RunView, w: WorkerView, at: datetime, fx: Effects) -> None:
    """No progress for the stall timeout: stalled from its last progress, maybe restarted."""
    timeout = run.policy.stall_timeout
    if timeout is None or w.state != RUNNING or w.stop_cause or w.stalled_since is not None:
        return
    if w.progress_at is None:
        w.progress_at = at
    _mark_stalled(run, w, f"Stalled: no progress for {format_duration(timeout)}", fx)
    if run.policy.on_stall == "restart":
        _stall_stops_gang(run, w, at, fx)


def check_timers(run: RunView, now: datetime, fx: Effects) -> None:
    """The rules that fire with time: the gang barrier, the time limit, stalls."""
    if run.ended:
        return
    limit = run.policy.time_limit
    if limit is not None and run.started_at is not None and now >= run.started_at + limit:
        if run.placed:
            time_limit_reached(run, now, fx)
        elif run.stop_cause is None:
            _end(run, FAILED, time_limit_sentence(limit), now, fx, EndCause.TIME_LIMIT)
        return
    if run.stop_cause is not None:
        return
    if (
        run.state in (PREPARING, PULLING, STARTING)
        and run.placed_at is not None
        and now - run.placed_at >= BARRIER_TIMEOUT
    ):
        barrier_timed_out(run, now, fx)
        return
    find_stragglers(run, now)
    stalled = _find_stalls(run, now, fx)  # every one of them, before any stops the gang
    if stalled and run.policy.on_stall == "restart":
        _stall_stops_gang(run, stalled[0], now, fx)


def delete(run: RunView, by: str, at: datetime, fx: Effects, *, machines: set[int]) -> None:
    """Deleted: every worker is removed, with its logs on every machine that ran it."""
    for w in run.workers:
        if w.alive:
            _release_room(w)
        w.stop_cause = None
        if w.state not in ENDED_STATES or w.phase != Phase.ENDED:
            _set_worker(
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
    _set_run(fx, run, DELETED, f"Deleted by {by}", at)
    fx.freed = True
