"""The failure panel's classification: every row of the seed's table (seed L-49 … L-57, L-59)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from backend.lifecycle.rules import (
    MACHINE_LOST,
    OOM_KILLED,
    budget_exhausted_sentence,
    preempted_sentence,
    time_limit_sentence,
)
from backend.runs.failures import FailureKind, classify, first_failed, waiting, worker_failure


@pytest.mark.parametrize(
    ("reason", "exit_code", "kind", "look_at"),
    [
        ("Exited with code 1", 1, FailureKind.PROGRAM, "Your program: its log."),
        ("Exited with code 125", 125, FailureKind.PROGRAM, "Your program: its log."),
        (
            "Exited with code 127",
            127,
            FailureKind.COMMAND_NOT_FOUND,
            "The command is not in the image. Check command and the image's PATH.",
        ),
        (
            OOM_KILLED,
            137,
            FailureKind.OUT_OF_MEMORY,
            "Memory: the Memory chart near the limit. Raise memory_bytes or "
            "per_gpu.memory_bytes, or lower the batch size.",
        ),
        (
            "ErrImagePull: manifest for ghcr.io/acme/train:v9 not found",
            None,
            FailureKind.IMAGE_PULL,
            "Image name and tag; for a private registry, the registry credential.",
        ),
        (
            time_limit_sentence(timedelta(hours=12)),
            None,
            FailureKind.TIME_LIMIT,
            "The time limit: raise it, or checkpoint and resume.",
        ),
        (
            MACHINE_LOST,
            None,
            FailureKind.MACHINE_LOST,
            "The machine, not the run: see Machines troubleshooting. Restarted under its policy.",
        ),
        (
            budget_exhausted_sentence(10),
            1,
            FailureKind.RETRY_BUDGET,
            "It failed 10 times in a row: the first failure's cause is in last_failure.",
        ),
        (
            preempted_sentence("llama-70b"),
            None,
            FailureKind.PREEMPTED,
            "Not a failure: it is queued again.",
        ),
        ("Exited with code 139", 139, FailureKind.SIGNAL, None),
        ("Something nobody foresaw", None, FailureKind.OTHER, "Its log."),
    ],
)
def test_each_reason_of_the_seeds_table_has_its_advice(
    reason: str, exit_code: int | None, kind: FailureKind, look_at: str | None
) -> None:
    advice = classify(reason, exit_code)
    assert advice.kind == kind
    if look_at is not None:
        assert advice.look_at == look_at
    # an OOM kill opens the Memory chart, a lost machine the machine, the rest the log
    opens = {FailureKind.OUT_OF_MEMORY: "memory", FailureKind.MACHINE_LOST: "machine"}
    assert advice.open == opens.get(kind, "log")


def test_the_exit_code_decides_when_the_reason_does_not_say() -> None:
    assert classify("Failed", 127).kind == FailureKind.COMMAND_NOT_FOUND
    assert classify("Failed", 3).kind == FailureKind.PROGRAM
    assert classify("Failed", None).kind == FailureKind.OTHER


def test_which_failure_a_worker_explains() -> None:
    snapshot = {"reason": "Exited with code 1", "exit_code": 1, "log_tail": "Traceback"}
    assert worker_failure("Failed", "Exited with code 2", 2, snapshot) == (
        "Exited with code 2",
        2,
    )
    assert worker_failure("Restarting", "Restarting in 20s", None, snapshot) == (
        "Exited with code 1",
        1,
    )
    assert worker_failure("Running", "Container running", None, None) is None


def test_the_run_reason_names_the_first_worker_that_failed() -> None:
    t0, t1 = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 10, 2, tzinfo=UTC)
    named = (
        "Worker llama-sft-1 failed on gpu-08: Exited with code 1; the gang does not run without it"
    )
    assert first_failed(named, [("llama-sft-0", t0), ("llama-sft-1", t1)]) == "llama-sft-1"
    assert first_failed("Failed", [("a-1", t1), ("a-0", t0)]) == "a-0"
    assert first_failed("Failed", []) is None


@pytest.mark.parametrize(
    ("reason", "kind", "look_at"),
    [
        (
            "No machine fits: local has no ready machine",
            FailureKind.MACHINES,
            "The per-machine reasons: Read a pending reason.",
        ),
        (
            "Gang cannot be placed whole: room for 1 of 2 workers of 4 GPUs",
            FailureKind.MACHINES,
            "The per-machine reasons: Read a pending reason.",
        ),
        ("Queued behind llama-70b", FailureKind.QUEUE, "The queue, not the machines: Priorities."),
        (
            "Next to run: waiting for sweep-7 to stop",
            FailureKind.QUEUE,
            "The queue, not the machines: Priorities.",
        ),
        (
            "Waits for namespace quota: team-a holds 16 of 16 GPUs",
            FailureKind.QUEUE,
            "The queue, not the machines: Priorities.",
        ),
        (
            "Cannot plan workers: 3 workers of 5 GPUs are more than …",
            FailureKind.PLAN,
            "The GPU count does not split as asked: change machines or the count.",
        ),
        (
            "waiting for external secret hf-token",
            FailureKind.CREDENTIAL,
            "The credential has not reached the machine: open the credential to see whether the "
            "machine could fetch it.",
        ),
        (
            "Waiting for drive datasets to be filled",
            FailureKind.DRIVE,
            "The drive: open it to see whether it is reachable or still copying.",
        ),
        (
            "Pulling image ghcr.io/acme/train:v9",
            FailureKind.PULLING,
            "A large image on a slow link. Later runs on that machine reuse it.",
        ),
        (
            "Starting together: 1 of 2 ready",
            FailureKind.BARRIER,
            "One member is still preparing or pulling; after 15 minutes at the barrier the gang "
            "is requeued.",
        ),
    ],
)
def test_each_wait_of_the_seeds_table_has_its_advice(
    reason: str, kind: FailureKind, look_at: str
) -> None:
    # seed L-61 … L-67: Debug a run that does not start
    found = waiting(["Run created", reason])
    assert found is not None
    advice, said = found
    assert (advice.kind, advice.look_at, said) == (kind, look_at, reason)


def test_a_run_going_well_needs_no_advice() -> None:
    assert waiting(["2 of 2 workers running", "Container running"]) is None
