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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class FailureKind(StrEnum):
    PROGRAM = "program"
    COMMAND_NOT_FOUND = "command_not_found"
    OUT_OF_MEMORY = "out_of_memory"
    IMAGE_PULL = "image_pull"
    TIME_LIMIT = "time_limit"
    MACHINE_LOST = "machine_lost"
    RETRY_BUDGET = "retry_budget"
    PREEMPTED = "preempted"
    SIGNAL = "signal"
    OTHER = "other"
    # why a run does not start
    MACHINES = "machines"
    QUEUE = "queue"
    PLAN = "plan"
    CREDENTIAL = "credential"
    DRIVE = "drive"
    PULLING = "pulling"
    BARRIER = "barrier"


@dataclass(frozen=True)
class Advice:
    kind: FailureKind
    look_at: str  # the seed's "Look at" sentence
    # What to open beside it: "log" (the worker's), "memory" (its Memory chart), "machine".
    open: str


_EXITED = re.compile(r"^Exited with code (\d+)")
_BUDGET = re.compile(r"^Retry budget exhausted after (\d+)/\d+ restarts")

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
SIGNAL = Advice(
    FailureKind.SIGNAL,
    "Killed by a signal: its log, and the Memory chart for a kill from outside.",
    "log",
)
OTHER = Advice(FailureKind.OTHER, "Its log.", "log")


def classify(reason: str, exit_code: int | None = None) -> Advice:
    """The advice for a worker's failure reason (its sentence) and exit code."""
    if reason.startswith("OOMKilled"):
        return OUT_OF_MEMORY
    if reason.startswith("ErrImagePull"):
        return IMAGE_PULL
    if reason.startswith("Exceeded its time limit"):
        return TIME_LIMIT
    if reason.startswith("Machine lost"):
        return MACHINE_LOST
    if reason.startswith("Preempted by"):
        return PREEMPTED
    budget = _BUDGET.match(reason)
    if budget:
        times = budget.group(1)
        return Advice(
            FailureKind.RETRY_BUDGET,
            f"It failed {times} times in a row: the first failure's cause is in last_failure.",
            "log",
        )
    exited = _EXITED.match(reason)
    code = int(exited.group(1)) if exited else exit_code
    if code == 127:
        return COMMAND_NOT_FOUND
    if code is not None and 1 <= code <= 125:
        return PROGRAM
    if code is not None and code > 128:
        return SIGNAL  # 128 + the signal's number; an OOM kill says OOMKilled (above)
    return OTHER


def worker_failure(
    state: str, reason: str, exit_code: int | None, last_failure: dict[str, Any] | None
) -> tuple[str, int | None] | None:
    """The failure a worker's panel explains: its own end when it failed, else its last failure
    (a worker restarting after one); None when it never failed."""
    if state == "Failed":
        return reason, exit_code
    if last_failure:
        return str(last_failure.get("reason") or ""), last_failure.get("exit_code")
    return None


_FAILED_WORKER = re.compile(r"^Worker (\S+) failed")


def first_failed(run_reason: str, failed: list[tuple[str, Any]]) -> str | None:
    """The worker that failed the run for good: the one its reason names (seed: "The run's
    reason names the first worker that failed for good"), else the first to fail of
    ``failed`` (worker name and when it failed)."""
    named = _FAILED_WORKER.match(run_reason)
    if named:
        return named.group(1)
    return min(failed, key=lambda f: f[1])[0] if failed else None


# Debug a run that does not start: It is … / Look at …
WAITS: tuple[tuple[tuple[str, ...], Advice], ...] = (
    (
        ("No machine fits", "Gang cannot be placed whole"),
        Advice(FailureKind.MACHINES, "The per-machine reasons: Read a pending reason.", "machines"),
    ),
    (
        ("Queued behind", "Next to run", "Waits for namespace quota"),
        Advice(FailureKind.QUEUE, "The queue, not the machines: Priorities.", "queue"),
    ),
    (
        ("Cannot plan workers",),
        Advice(
            FailureKind.PLAN,
            "The GPU count does not split as asked: change machines or the count.",
            "spec",
        ),
    ),
    (
        ("waiting for external secret",),
        Advice(
            FailureKind.CREDENTIAL,
            "The credential has not reached the machine: open the credential to see whether the "
            "machine could fetch it.",
            "credential",
        ),
    ),
    (
        ("Waiting for data volume", "Waiting for drive"),
        Advice(
            FailureKind.DRIVE,
            "The drive: open it to see whether it is reachable or still copying.",
            "drive",
        ),
    ),
    (
        ("Pulling image",),
        Advice(
            FailureKind.PULLING,
            "A large image on a slow link. Later runs on that machine reuse it.",
            "log",
        ),
    ),
    (
        ("Starting together",),
        Advice(
            FailureKind.BARRIER,
            "One member is still preparing or pulling; after 15 minutes at the barrier the gang "
            "is requeued.",
            "workers",
        ),
    ),
)


def waiting(reasons: list[str]) -> tuple[Advice, str] | None:
    """Why a run does not start, from its reason and its workers' (the first that says): the
    advice and the reason it explains."""
    for reason in reasons:
        for starts, advice in WAITS:
            if reason.startswith(starts):
                return advice, reason
    return None
