"""What a failure or a wait means and where to look (seed logs-metrics-debugging.txt, "Debug a
failed run, step by step", 2: classify it by the worker's reason and exit code; and "Debug a
run that does not start").

    Reason                                       Look at
    Exited with code 1 (or any 1 to 125)         Your program: its log.
    Exited with code 127                         The command is not in the image. …
    OOMKilled: the container exceeded its …      Memory: the Memory chart near the limit. …
    ErrImagePull: …                              Image name and tag; …
    Exceeded its time limit of 12h               The time limit: raise it, or checkpoint and resume.
    Machine lost: its lease expired              The machine, not the run: …
    Retry budget exhausted after 10/10 restarts  It failed 10 times in a row: …
    Preempted by higher-priority work (…)        Not a failure: it is queued again.

A stall (no row of its own) points at step 5, the metrics around the failure; a run restarting
in a loop at the Restarting in a loop panel ("Debug a run that does not start"). A command its
machine did not run because it names a file the workload's user may not read (no row either: a
script under /root, workloads running as unprivileged users) says how to make it readable; an
exit whose last lines say "Permission denied" (a file the machine could not see named, as in
``bash -c "python x.py"``) keeps the program's advice, with that hint.

A failure is classified by its stored cause (lifecycle.sentences.EndCause: workers.cause,
runs.cause) and its exit code, never by its sentence, which the lifecycle writes from the cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from backend.lifecycle.endings import RESTART_COUNT_RESET
from backend.lifecycle.sentences import EndCause
from backend.lifecycle.states import RunState, Wait


class FailureKind(StrEnum):
    PROGRAM = "program"
    COMMAND_NOT_FOUND = "command_not_found"
    OUT_OF_MEMORY = "out_of_memory"
    IMAGE_PULL = "image_pull"
    TIME_LIMIT = "time_limit"
    MACHINE_LOST = "machine_lost"
    RETRY_BUDGET = "retry_budget"
    PREEMPTED = "preempted"
    STALLED = "stalled"
    SIGNAL = "signal"
    UNREADABLE = "unreadable"
    OTHER = "other"
    # why a run does not start
    MACHINES = "machines"
    QUEUE = "queue"
    PLAN = "plan"
    CREDENTIAL = "credential"
    DRIVE = "drive"
    PULLING = "pulling"
    BARRIER = "barrier"
    RESTART_LOOP = "restart_loop"


@dataclass(frozen=True)
class Advice:
    kind: FailureKind
    look_at: str  # the seed's "Look at" sentence
    # What to open beside it: "log" (the worker's), "memory" (its Memory chart), "machine".
    open: str


PROGRAM = Advice(FailureKind.PROGRAM, "Your program: its log.", "log")
COMMAND_NOT_FOUND = Advice(
    FailureKind.COMMAND_NOT_FOUND,
    "The command is not in the image. Check command and the image's PATH.",
    "log",
)
OUT_OF_MEMORY = Advice(
    FailureKind.OUT_OF_MEMORY,
    "Memory: the Memory chart near the limit. Raise memory_bytes or per_gpu.memory_bytes, or "
    "lower the batch size.",
    "memory",
)
IMAGE_PULL = Advice(
    FailureKind.IMAGE_PULL,
    "Image name and tag; for a private registry, the registry credential.",
    "log",
)
TIME_LIMIT = Advice(
    FailureKind.TIME_LIMIT, "The time limit: raise it, or checkpoint and resume.", "log"
)
MACHINE_LOST = Advice(
    FailureKind.MACHINE_LOST,
    "The machine, not the run: see Machines troubleshooting. Restarted under its policy.",
    "machine",
)
PREEMPTED = Advice(FailureKind.PREEMPTED, "Not a failure: it is queued again.", "log")
# A stall has no row of its own in the seed's table; its step 5 is where a hang shows.
STALLED = Advice(
    FailureKind.STALLED,
    "Check the metrics around the failure: memory climbing to the limit, a GPU at 0% (a hang), "
    "network traffic stopping.",
    "metrics",
)
# Debug a run that does not start: "A worker restarting in a loop".
RESTART_LOOP = Advice(
    FailureKind.RESTART_LOOP,
    "The console's Restarting in a loop panel: restarts, when the next attempt is, and the last "
    "failure's output. Each failure doubles the wait, up to 5 minutes; after 10 restarts in a row "
    "it gives up; 10 minutes running resets the count.",
    "restarts",
)
SIGNAL = Advice(
    FailureKind.SIGNAL,
    "Killed by a signal: its log, and the Memory chart for a kill from outside.",
    "log",
)
OTHER = Advice(FailureKind.OTHER, "Its log.", "log")
UNREADABLE = Advice(
    FailureKind.UNREADABLE,
    "The workload runs as an unprivileged user, who may not read the file its reason names: "
    "make it readable to others (chmod o+r on the file, o+x on each folder above it), or put "
    "it on a drive (mounts) or in a folder others may read.",
    "log",
)
# An exit whose output says a file could not be opened for want of rights (Python's "[Errno
# 13] Permission denied", a shell's "Permission denied"): the program's advice, with the hint.
PERMISSION_DENIED = "Permission denied"
PROGRAM_DENIED = Advice(
    FailureKind.PROGRAM,
    'Your program: its log. Its last lines say "Permission denied": the workload runs as an '
    "unprivileged user, who may not read a file it opens; make the file readable to others "
    "(chmod o+r, and o+x on each folder above it), or put it on a drive (mounts).",
    "log",
)


# The causes whose advice does not depend on an exit code.
_BY_CAUSE = {
    EndCause.OOM_KILLED: OUT_OF_MEMORY,
    EndCause.IMAGE_PULL: IMAGE_PULL,
    EndCause.TIME_LIMIT: TIME_LIMIT,
    EndCause.MACHINE_LOST: MACHINE_LOST,
    EndCause.PREEMPTED: PREEMPTED,
    EndCause.STALLED: STALLED,
    EndCause.SIGNALLED: SIGNAL,
    EndCause.NOT_FOUND: COMMAND_NOT_FOUND,
    EndCause.UNREADABLE: UNREADABLE,
}
# The causes a run's own sentence carries (not a worker's end): its failed worker is not the
# one its first failure names.
_RUN_CAUSES = frozenset(
    {EndCause.RETRY_BUDGET, EndCause.TIME_LIMIT, EndCause.STALLED, EndCause.PREEMPTED}
)


def classify(
    cause: str | None,
    exit_code: int | None = None,
    *,
    max_restarts: int | None = None,
    log_tail: str = "",
) -> Advice:
    """The advice for a failure's cause (an EndCause, None when unknown) and exit code; a spent
    retry budget's names the run's ``max_restarts``; a program's exit whose last lines
    (``log_tail``, the workload's own output) say "Permission denied" hints at a file's
    rights."""
    if cause == EndCause.RETRY_BUDGET and max_restarts is not None:
        plural = "time" if max_restarts == 1 else "times"  # max_restarts: 1 said "1 times"
        return Advice(
            FailureKind.RETRY_BUDGET,
            f"It failed {max_restarts} {plural} in a row: the first failure's cause is in "
            "last_failure.",
            "log",
        )
    if cause in _BY_CAUSE:
        return _BY_CAUSE[EndCause(cause)]
    if exit_code == 127:
        return COMMAND_NOT_FOUND
    if exit_code is not None and 1 <= exit_code <= 125:
        return PROGRAM_DENIED if PERMISSION_DENIED in log_tail else PROGRAM
    if exit_code is not None and exit_code > 128:
        return SIGNAL  # 128 + the signal's number; an OOM kill's cause says so (above)
    return OTHER


def worker_failure(
    state: str, reason: str, exit_code: int | None, last_failure: dict[str, Any] | None
) -> tuple[str, int | None] | None:
    """The failure a worker's panel explains: its own end when it failed, else its last failure
    (a worker restarting after one); None when it never failed. Its cause is the worker's
    (the cause of its last failure snapshot, which its own failure writes too)."""
    if state == "Failed":
        return reason, exit_code
    if last_failure:
        return str(last_failure.get("reason") or ""), last_failure.get("exit_code")
    return None


def first_failed(
    cause: str | None,
    first_failure: dict[str, Any] | None,
    failed: list[tuple[str, Any]],
    snapshots: list[tuple[str, int, Any]] | None = None,
) -> str | None:
    """The worker that failed the run for good: the one its reason names (seed: "The run's
    reason names the first worker that failed for good"), the gang's first failure when the
    run failed for a worker's end (its ``cause``); else the first to fail of ``failed``
    (worker name and when it failed); a run whose workers were stopped (its time limit, a
    stall that spent the retry budget) failed none: the worker of the newest failure snapshot
    (``snapshots``: name, rank, failed_at)."""
    if cause is not None and cause not in _RUN_CAUSES and first_failure:
        return str(first_failure["worker"])
    if failed:
        return min(failed, key=lambda f: f[1])[0]
    return last_snapshot(snapshots or [])


def run_advice(
    state: str,
    cause: str | None,
    run_reason: str,
    exit_code: int | None = None,
    *,
    max_restarts: int | None = None,
    log_tail: str = "",
) -> tuple[Advice, str] | None:
    """What a run's failure means, from its cause (a time limit, a retry budget, a preemption,
    a stall, a lost machine, or the cause of the failed worker's end) with the exit code and
    last lines of the worker that failed it: the advice and the reason it explains. A Failed
    run, a run torn down or restarting after a failure, and a preempted run (until it runs
    again) have one; None for the others."""
    if state == "Failed" or cause is not None:
        advice = classify(cause, exit_code, max_restarts=max_restarts, log_tail=log_tail)
        return advice, run_reason
    return None


def run_advised(
    run: Any, failed: Any | None, max_restarts: int | None
) -> tuple[Advice, str, int | None] | None:
    """A run's advice as GraphQL and the REST shim show it (a run row with state, cause and
    reason; ``failed``, the row of the worker that failed it, if any): the advice, the reason it
    explains and the exit code of that worker, whose last lines are read too."""
    exit_code = failed.exit_code if failed is not None else None
    tail = tail_of(failed.last_failure) if failed is not None else ""
    found = run_advice(
        run.state, run.cause, run.reason, exit_code, max_restarts=max_restarts, log_tail=tail
    )
    return None if found is None else (*found, exit_code)


def restarts_in_row(failures_in_row: int, running_since: datetime | None, now: datetime) -> int:
    """The restarts a run made in a row, as the rules count them: ten minutes of running with
    every worker up resets the count (seed L-69)."""
    if running_since is not None and now - running_since >= RESTART_COUNT_RESET:
        return 0
    return failures_in_row


def last_snapshot(snapshots: list[tuple[str, int, Any]]) -> str | None:
    """Of the workers' last failure snapshots (name, rank, failed_at), the worker whose is the
    newest (the lowest rank of those that ended together): the last failure's output."""
    dated = [(_moment(at), -rank, name) for name, rank, at in snapshots if at is not None]
    if not dated:
        return None
    newest = max(at for at, _, _ in dated)
    return max((d for d in dated if d[0] == newest), key=lambda d: d[1])[2]


def snapshots_of(workers: Sequence[Any]) -> list[tuple[str, int, Any]]:
    """Each worker's last failure snapshot (of rows with name, rank, last_failure): name, rank,
    failed_at."""
    return [
        (w.name, w.rank, (w.last_failure or {}).get("failed_at")) for w in workers if w.last_failure
    ]


def failed_worker_name(run: Any, workers: Sequence[Any]) -> str | None:
    """The worker that failed a Failed run (a row with cause and first_failure; of rows with
    name, rank, state, state_since and last_failure): its reason names it, else the first that
    failed, else the one of the newest snapshot (a time limit stops every worker and fails
    none)."""
    failed = [(w.name, w.state_since) for w in workers if w.state == "Failed"]
    return first_failed(run.cause, run.first_failure, failed, snapshots_of(workers))


def failed_worker(run: Any, workers: Sequence[Any]) -> Any | None:
    """The row of the worker that failed a Failed run (failed_worker_name), if one of
    ``workers``."""
    name = failed_worker_name(run, workers)
    return next((w for w in workers if w.name == name), None)


def advice_json(advice: Advice, reason: str, exit_code: int | None) -> dict[str, Any]:
    """The advice as the REST shim writes it (GraphQL's Advice, in snake case)."""
    return {
        "reason": reason,
        "exit_code": exit_code,
        "kind": advice.kind.value,
        "look_at": advice.look_at,
        "open": advice.open,
    }


def worker_advised(
    state: str,
    reason: str,
    exit_code: int | None,
    cause: str | None,
    last_failure: dict[str, Any] | None,
) -> tuple[Advice, str, int | None] | None:
    """A worker's failure turned into advice: its own end when it failed, else its last failure;
    the advice, the reason it explains and the exit code; None when it never failed."""
    failure = worker_failure(state, reason, exit_code, last_failure)
    if failure is None:
        return None
    reason, exit_code = failure
    return classify(cause, exit_code, log_tail=tail_of(last_failure)), reason, exit_code


def worker_advice(worker: Any) -> dict[str, Any] | None:
    """``worker_advised`` of a row (with state, reason, exit_code, cause and last_failure) as the
    REST shim writes it."""
    found = worker_advised(
        worker.state, worker.reason, worker.exit_code, worker.cause, worker.last_failure
    )
    return None if found is None else advice_json(*found)


def tail_of(last_failure: dict[str, Any] | None) -> str:
    """The last lines of a failure snapshot (seed L-21), "" without one."""
    return str((last_failure or {}).get("log_tail") or "")


def _moment(at: Any) -> datetime:
    moment = datetime.fromisoformat(at) if isinstance(at, str) else at
    assert isinstance(moment, datetime)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# Debug a run that does not start: It is … / Look at …, by what it waits for (lifecycle.states.Wait,
# stored beside the reason that says it). A run naming an image where no machine runs
# containers waits for machines too: each machine's reason says it runs processes, not
# containers (issue 36: its page had no Why it does not start panel).
MACHINES = Advice(
    FailureKind.MACHINES, "The per-machine reasons: Read a pending reason.", "machines"
)
WAIT_ADVICE: dict[str, Advice] = {
    Wait.MACHINES: MACHINES,
    Wait.CONTAINERS: MACHINES,
    Wait.QUEUE: Advice(FailureKind.QUEUE, "The queue, not the machines: Priorities.", "queue"),
    Wait.PLAN: Advice(
        FailureKind.PLAN,
        "The GPU count does not split as asked: change machines or the count.",
        "spec",
    ),
    Wait.SECRET: Advice(
        FailureKind.CREDENTIAL,
        "The credential has not reached the machine: open the credential to see whether the "
        "machine could fetch it.",
        "credential",
    ),
    Wait.DRIVE: Advice(
        FailureKind.DRIVE,
        "The drive: open it to see whether it is reachable or still copying.",
        "drive",
    ),
    Wait.CODE: Advice(
        FailureKind.PULLING,
        "Its code (--workdir) on a slow link from the server: leave out what the run does not "
        "need in .astraeusignore. Later runs of the same code on that machine reuse it.",
        "log",
    ),
}
PULLING = Advice(
    FailureKind.PULLING,
    "A large image on a slow link. Later runs on that machine reuse it.",
    "log",
)
BARRIER = Advice(
    FailureKind.BARRIER,
    "One member is still preparing or pulling; after 15 minutes at the barrier the gang is "
    "requeued.",
    "workers",
)


@dataclass(frozen=True)
class Waiting:
    """A run, or one of its workers, as the advice on its wait reads it: its state, its reason
    and what it waits for (runs.waits_for, workers.waits_for); a run's restart time and whether
    it is being stopped."""

    state: str
    reason: str
    waits_for: str | None
    restart_at: datetime | None = None
    stopping: bool = False


def waiting(run: Waiting, workers: Sequence[Waiting]) -> tuple[Advice, str] | None:
    """Why a run does not start, and where to look: the advice and the reason it explains, from
    the states and what the run and its workers wait for, never from the sentences. A pending
    run waits for what the scheduler said, or, when it has said nothing since the run was
    requeued with a restart time, for its restart; a starting one at the gang barrier; a
    preparing or pulling one for what its slowest worker waits for (the run's first)."""
    if run.stopping:
        return None
    if run.state == RunState.PENDING:
        if run.waits_for is None:
            return (RESTART_LOOP, run.reason) if run.restart_at is not None else None
        found = WAIT_ADVICE.get(run.waits_for)
        return None if found is None else (found, run.reason)
    if run.state == RunState.STARTING:
        return BARRIER, run.reason
    for each in (run, *workers):
        if each.state == RunState.PULLING:
            return PULLING, each.reason
        if each.state == RunState.PREPARING and each.waits_for in WAIT_ADVICE:
            return WAIT_ADVICE[each.waits_for], each.reason
    return None
