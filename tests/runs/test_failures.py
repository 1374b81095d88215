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
from backend.runs.failures import (
    FailureKind,
    classify,
    first_failed,
    last_snapshot,
    restarts_in_row,
    run_advice,
    run_cause,
    waiting,
    worker_failure,
)


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
            budget_exhausted_sentence(1),
            143,
            FailureKind.RETRY_BUDGET,
            "It failed 1 time in a row: the first failure's cause is in last_failure.",
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


# -- issue 20: every failure keeps its story -------------------------------------------------

STALLED_LOOK_AT = (
    "Check the metrics around the failure: memory climbing to the limit, a GPU at 0% (a hang), "
    "network traffic stopping."
)
LOOP_LOOK_AT = (
    "The console's Restarting in a loop panel: restarts, when the next attempt is, and the last "
    "failure's output. Each failure doubles the wait, up to 5 minutes; after 10 restarts in a row "
    "it gives up; 10 minutes running resets the count."
)


@pytest.mark.parametrize(
    "reason",
    ["Stalled: no progress for 30m", "Worker llama-sft-1 stalled on gpu-08: no progress for 30m"],
)
def test_a_stall_points_at_the_metrics_around_it(reason: str) -> None:
    # seed "Debug a failed run", step 5: a GPU at 0% (a hang)
    advice = classify(reason, 143)
    assert (advice.kind, advice.look_at, advice.open) == (
        FailureKind.STALLED,
        STALLED_LOOK_AT,
        "metrics",
    )


@pytest.mark.parametrize(
    ("state", "reason", "exit_code", "kind", "look_at"),
    [
        # seed L-54
        (
            "Failed",
            time_limit_sentence(timedelta(hours=12)),
            143,
            FailureKind.TIME_LIMIT,
            "The time limit: raise it, or checkpoint and resume.",
        ),
        # seed L-56: not the last worker's "Your program: its log."
        (
            "Failed",
            budget_exhausted_sentence(10),
            1,
            FailureKind.RETRY_BUDGET,
            "It failed 10 times in a row: the first failure's cause is in last_failure.",
        ),
        # seed L-57: a preempted run until it runs again, and while it winds down
        (
            "Pending",
            preempted_sentence("llm"),
            None,
            FailureKind.PREEMPTED,
            "Not a failure: it is queued again.",
        ),
        (
            "Running",
            "Preempted by a drain of gpu-07",
            None,
            FailureKind.PREEMPTED,
            "Not a failure: it is queued again.",
        ),
        # seed L-55, restarting after its machine was lost
        (
            "Pending",
            "Restarting in 10s (1/10): Worker llama-sft-0 failed on gpu-07: Machine lost: its "
            "lease expired; the gang does not run without it",
            None,
            FailureKind.MACHINE_LOST,
            "The machine, not the run: see Machines troubleshooting. Restarted under its policy.",
        ),
        # a stall loop
        (
            "Pending",
            "Restarting in 40s (3/10): Worker llama-sft-1 stalled on gpu-08: no progress for 5m",
            None,
            FailureKind.STALLED,
            STALLED_LOOK_AT,
        ),
        # a gang's failure: the worker's reason it names
        (
            "Failed",
            "Worker llama-sft-1 failed on gpu-08: Exited with code 1; the gang does not run "
            "without it",
            1,
            FailureKind.PROGRAM,
            "Your program: its log.",
        ),
        (
            "Failed",
            "Worker llama-sft-1 failed on gpu-08: "
            + OOM_KILLED
            + "; the gang does not run without it",
            137,
            FailureKind.OUT_OF_MEMORY,
            "Memory: the Memory chart near the limit. Raise memory_bytes or "
            "per_gpu.memory_bytes, or lower the batch size.",
        ),
    ],
)
def test_a_runs_own_sentence_gives_its_advice(
    state: str, reason: str, exit_code: int | None, kind: FailureKind, look_at: str
) -> None:
    found = run_advice(state, reason, exit_code)
    assert found is not None
    advice, said = found
    assert (advice.kind, advice.look_at, said) == (kind, look_at, reason)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("Running", "2 of 2 workers running"),
        ("Pending", "Queued behind llama-70b"),
        ("Starting", "Starting together: 1 of 2 ready"),
        ("Completed", "2 of 2 workers completed"),
        ("Stopped", "Stopped by alice"),
    ],
)
def test_a_run_that_did_not_fail_has_no_failure_advice(state: str, reason: str) -> None:
    assert run_advice(state, reason) is None


def test_the_runs_sentence_carries_the_workers_reason() -> None:
    assert (
        run_cause(
            "Restarting in 5m (7/10): Worker a-0 failed on m: Exited with code 3; "
            "the gang does not run without it"
        )
        == "Exited with code 3"
    )
    assert run_cause(
        "Worker a-0 failed: " + MACHINE_LOST + "; the gang does not run without it"
    ) == (MACHINE_LOST)
    assert run_cause("Exceeded its time limit of 1h") == "Exceeded its time limit of 1h"


def test_a_restarting_run_waits_in_the_restarting_in_a_loop_panel() -> None:
    # seed L-68: Debug a run that does not start, "A worker restarting in a loop"
    found = waiting(
        [
            "Restarting in 20s (2/10): Worker a-0 failed on m: Exited with code 1; "
            "the gang does not run without it",
            "Waiting to be placed again: …",
        ]
    )
    assert found is not None
    assert (found[0].kind, found[0].look_at) == (FailureKind.RESTART_LOOP, LOOP_LOOK_AT)


def test_ten_minutes_running_resets_the_restarts_in_a_row() -> None:
    # seed L-69
    t0 = datetime(2026, 10, 1, tzinfo=UTC)
    assert restarts_in_row(6, None, t0) == 6
    assert restarts_in_row(6, t0, t0 + timedelta(minutes=9, seconds=59)) == 6
    assert restarts_in_row(6, t0, t0 + timedelta(minutes=10)) == 0


def test_a_run_that_failed_no_worker_shows_the_newest_snapshot() -> None:
    # a time limit stops every worker and fails none: the newest snapshot, lowest rank first
    t0, t1 = "2026-10-01T01:00:00+00:00", "2026-10-01T02:00:00+00:00"
    snapshots = [("a-2", 2, t1), ("a-1", 1, t1), ("a-0", 0, t0)]
    assert last_snapshot(snapshots) == "a-1"
    assert first_failed("Exceeded its time limit of 1h", [], snapshots) == "a-1"
    assert first_failed("Exceeded its time limit of 1h", [], []) is None
    # a worker that failed wins over snapshots
    at = datetime(2026, 10, 1, tzinfo=UTC)
    assert first_failed(budget_exhausted_sentence(2), [("a-2", at)], snapshots) == "a-2"
