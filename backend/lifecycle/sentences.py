"""The seed's sentences: what people read for a worker's or a run's end, wait, failure,
preemption or restart; and why an attempt ended (EndCause, End), which each end's sentence is
written from. Pure, as every lifecycle rule (lifecycle/rules.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from backend.config import format_duration
from backend.lifecycle.states import Wait
from backend.words import counted

RESTART_BASE = timedelta(seconds=10)
RESTART_CAP = timedelta(minutes=5)


# The seed's sentences.
OOM_KILLED = "OOMKilled: the container exceeded its memory limit"
MACHINE_LOST = "Machine lost: its lease expired"
CONTAINER_RUNNING = "Container running"
WAITING_FOR_ROOM = "Waiting for room for all its workers at once"
LOST = "Lost: its process ended while the agent was away"
LOST_BEFORE_START = "Lost: its container never started"
STOPPED_BEFORE_START = "Stopped before it started"


def slurm_running(job_id: str) -> str:
    """A running worker of a Slurm job (Slurm runs it: no container of Astraeus's)."""
    return f"Running in Slurm job {job_id}"


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
    UNREADABLE = "unreadable"
    PORT_TAKEN = "port_taken"
    # As the server found it.
    MACHINE_LOST = "machine_lost"
    LOST_BY_AGENT = "lost_by_agent"
    GPU_FAULT = "gpu_fault"
    UNDELIVERABLE = "undeliverable"
    STALLED = "stalled"
    TIME_LIMIT = "time_limit"
    IDLE = "idle"  # stopped by its idle policy (issue 41)
    PREEMPTED = "preempted"
    RETRY_BUDGET = "retry_budget"


@dataclass(frozen=True)
class End:
    """How a worker's attempt ended: the cause and its facts. ``detail`` is what the machine
    alone knows (the engine's words on a pull, why it could not start) or the server's own
    sentence for the ends it finds itself (a GPU fault, an undeliverable command). An end
    UNREADABLE names the file (``detail``), the workload's ``uid`` and the folder on the way it
    may not enter (``blocked_at``; "": the file itself)."""

    cause: EndCause
    exit_code: int | None = None
    signal: int | None = None
    detail: str = ""
    uid: int | None = None
    blocked_at: str = ""
    # Its process limit, when the limit refused it a process or a thread (issue 37 N5).
    pids_limit: int | None = None
    # PORT_TAKEN: the port its agent holds for the gang's next placement there (None: none).
    offered_port: int | None = None


def exited_with(code: int) -> str:
    return f"Exited with code {code}"


def end_sentence(end: End) -> str:
    """The sentence people read for an end (seed: "Exited with code 1", "OOMKilled: …"), and
    that it reached its process limit when it did (a fork bomb, a thread pool too large)."""
    said = _end_sentence(end)
    if end.pids_limit is None:
        return said
    return f"{said}; it reached its limit of {end.pids_limit} processes and threads"


def _end_sentence(end: End) -> str:
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
    if end.cause == EndCause.UNREADABLE:
        return unreadable_sentence(end.detail, end.uid, end.blocked_at)
    if end.cause in (EndCause.EXITED, EndCause.SIGNALLED, EndCause.NOT_FOUND):
        return exited_with(end.exit_code if end.exit_code is not None else -1)
    return end.detail


def unreadable_sentence(path: str, uid: int | None, blocked_at: str) -> str:
    """``Cannot read /root/train.py: the workload runs as an unprivileged user (uid 2000000),
    who may not enter /root``: its command named a file its user may not reach."""
    who = "an unprivileged user" if uid is None else f"an unprivileged user (uid {uid})"
    if not blocked_at:
        why = "who may not read it"
    elif blocked_at == path:
        why = "who may not enter it"
    else:
        why = f"who may not enter {blocked_at}"
    return f"Cannot read {path}: the workload runs as {who}, {why}"


def waiting_sentence(wait: Wait, name: str, done: str = "") -> str:
    """What a preparing or pulling worker waits for, in the seed's words (L-64, L-65), from
    what its agent reported: the name of the secret, drive or image, and how far a pull is."""
    if wait == Wait.SECRET:
        return f"waiting for external secret {name}"
    if wait == Wait.DRIVE:
        return f"Waiting for drive {name} to be filled"
    if wait == Wait.IMAGE:
        return f"Pulling image {name}: {done}" if done else f"Pulling image {name}"
    if wait == Wait.CODE:
        return f"Fetching its code {name}: {done}" if done else f"Fetching its code {name}"
    raise ValueError(f"a worker's agent does not report waiting for {wait}")


def starting_together(ready: int, total: int) -> str:
    return f"Starting together: {ready} of {total} ready"


def workers_running(running: int, total: int) -> str:
    """Seed: "2 of 2 workers running" (and "1 of 1 worker running", not "1 workers")."""
    return f"{running} of {counted(total, 'worker')} running"


def workers_completed(total: int) -> str:
    return f"{total} of {counted(total, 'worker')} completed"


# A stalled run names this many of its stalled workers, and counts the others.
STALLED_NAMED = 3


def stalled_sentence(stalled: Sequence[tuple[str, str | None]], since: datetime) -> str:
    """A running run whose workers stalled and run on (``on_stall: keep``), in the words of a
    stall that stops its gang ("Worker llama-sft-1 stalled on gpu-08: no progress for 5m"):
    which (name, machine), and since when the first of them made none."""
    when = since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if len(stalled) == 1:
        name, machine = stalled[0]
        where = f" on {machine}" if machine else ""
        return f"Worker {name} stalled{where}: no progress since {when}"
    names = [name for name, _ in stalled[:STALLED_NAMED]]
    rest = len(stalled) - len(names)
    listed = ", ".join(names[:-1]) + f" and {names[-1]}" if not rest else ", ".join(names)
    if rest:
        listed += f" and {counted(rest, 'other')}"
    return f"Workers {listed} stalled: no progress since {when}"


def port_taken_sentence(port: str, machine: str | None) -> str:
    """A gang's rank 0 met its MASTER_PORT held by another program (issue 37 N3)."""
    where = f" on {machine}" if machine else ""
    return (
        f"MASTER_PORT {port} is in use{where} by another program: the gang is placed again on "
        "another port (not a failure of the run)"
    )


def worker_failed_sentence(worker: str, machine: str | None, reason: str) -> str:
    where = f" on {machine}" if machine else ""
    return f"Worker {worker} failed{where}: {reason}; the gang does not run without it"


def preempted_sentence(by_run: str) -> str:
    return f"Preempted by higher-priority work ({by_run})"


def drained_sentence(machine: str) -> str:
    return f"Preempted by a drain of {machine}"


def time_limit_sentence(limit: timedelta) -> str:
    return f"Exceeded its time limit of {format_duration(limit)}"


def idle_sentence(below: float, window: timedelta) -> str:
    """``idle: GPU utilization under 5% for 30 min``: an idle policy's finding (``below`` a
    ratio)."""
    percent = below * 100
    shown = f"{percent:.0f}" if percent == round(percent) else f"{percent:g}"
    return f"idle: GPU utilization under {shown}% for {minutes_shown(window)}"


def minutes_shown(window: timedelta) -> str:
    """``30 min``, ``2 h``, ``1 h 30 min``, ``2 d 3 h``: a whole-minute window as people say it."""
    minutes = int(window.total_seconds()) // 60
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min")) if n]
    return " ".join(parts) or "0 min"


def budget_exhausted_sentence(max_restarts: int) -> str:
    return f"Retry budget exhausted after {max_restarts}/{max_restarts} restarts"


def restart_backoff(failures_in_row: int) -> timedelta:
    """Each failure doubles the wait, from 10 seconds up to 5 minutes."""
    wait = RESTART_BASE * (2 ** max(failures_in_row - 1, 0))
    return min(wait, RESTART_CAP)
