"""The failure panel's classification: every row of the seed's table (seed L-49 … L-57, L-59)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from backend.lifecycle.sentences import (
    OOM_KILLED,
    End,
    EndCause,
    budget_exhausted_sentence,
    end_sentence,
    preempted_sentence,
    time_limit_sentence,
    waiting_sentence,
)
from backend.lifecycle.states import Wait
from backend.runs.failures import (
    FailureKind,
    Waiting,
    classify,
    first_failed,
    last_snapshot,
    restarts_in_row,
    run_advice,
    waiting,
    worker_failure,
)


@pytest.mark.parametrize(
    ("cause", "exit_code", "kind", "look_at"),
    [
        (EndCause.EXITED, 1, FailureKind.PROGRAM, "Your program: its log."),
        (EndCause.EXITED, 125, FailureKind.PROGRAM, "Your program: its log."),
        (
            EndCause.NOT_FOUND,
            127,
            FailureKind.COMMAND_NOT_FOUND,
            "The command is not in the image. Check command and the image's PATH.",
        ),
        (
            EndCause.EXITED,
            127,
            FailureKind.COMMAND_NOT_FOUND,
            "The command is not in the image. Check command and the image's PATH.",
        ),
        (
            EndCause.OOM_KILLED,
            137,
            FailureKind.OUT_OF_MEMORY,
            "Memory: the Memory chart near the limit. Raise memory_bytes or "
            "per_gpu.memory_bytes, or lower the batch size.",
        ),
        (
            EndCause.IMAGE_PULL,
            None,
            FailureKind.IMAGE_PULL,
            "Image name and tag; for a private registry, the registry credential.",
        ),
        (
            EndCause.TIME_LIMIT,
            None,
            FailureKind.TIME_LIMIT,
            "The time limit: raise it, or checkpoint and resume.",
        ),
        (
            EndCause.MACHINE_LOST,
            None,
            FailureKind.MACHINE_LOST,
            "The machine, not the run: see Machines troubleshooting. Restarted under its policy.",
        ),
        (
            EndCause.PREEMPTED,
            None,
            FailureKind.PREEMPTED,
            "Not a failure: it is queued again.",
        ),
        (EndCause.EXITED, 139, FailureKind.SIGNAL, None),
        (EndCause.SIGNALLED, 139, FailureKind.SIGNAL, None),
        (EndCause.SIGNALLED, 137, FailureKind.SIGNAL, None),
        (EndCause.NOT_STARTED, None, FailureKind.OTHER, "Its log."),
        (EndCause.LOST, None, FailureKind.OTHER, "Its log."),
        (None, None, FailureKind.OTHER, "Its log."),
    ],
)
def test_each_cause_of_the_seeds_table_has_its_advice(
    cause: EndCause | None, exit_code: int | None, kind: FailureKind, look_at: str | None
) -> None:
    advice = classify(cause, exit_code)
    assert advice.kind == kind
    if look_at is not None:
        assert advice.look_at == look_at
    # an OOM kill opens the Memory chart, a lost machine the machine, the rest the log
    opens = {FailureKind.OUT_OF_MEMORY: "memory", FailureKind.MACHINE_LOST: "machine"}
    assert advice.open == opens.get(kind, "log")


@pytest.mark.parametrize(("max_restarts", "times"), [(10, "10 times"), (1, "1 time")])
def test_a_spent_retry_budget_says_how_many_times_it_failed(max_restarts: int, times: str) -> None:
    advice = classify(EndCause.RETRY_BUDGET, 1, max_restarts=max_restarts)
    assert (advice.kind, advice.look_at) == (
        FailureKind.RETRY_BUDGET,
        f"It failed {times} in a row: the first failure's cause is in last_failure.",
    )


def test_the_exit_code_decides_when_the_cause_does_not_say() -> None:
    assert classify(EndCause.LOST_BY_AGENT, 127).kind == FailureKind.COMMAND_NOT_FOUND
    assert classify(None, 3).kind == FailureKind.PROGRAM
    assert classify(EndCause.GPU_FAULT, None).kind == FailureKind.OTHER


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
    first = {"worker": "llama-sft-1", "machine": "gpu-08", "reason": "Exited with code 1"}
    failed = [("llama-sft-0", t0), ("llama-sft-1", t1)]
    assert first_failed(EndCause.EXITED, first, failed) == "llama-sft-1"
    # a spent budget's sentence names no worker: the first that failed
    assert first_failed(EndCause.RETRY_BUDGET, first, failed) == "llama-sft-0"
    assert first_failed(None, None, [("a-1", t1), ("a-0", t0)]) == "a-0"
    assert first_failed(None, None, []) is None


LOOP_LOOK_AT = (
    "The console's Restarting in a loop panel: restarts, when the next attempt is, and the last "
    "failure's output. Each failure doubles the wait, up to 5 minutes; after 10 restarts in a row "
    "it gives up; 10 minutes running resets the count."
)
MACHINES_LOOK_AT = "The per-machine reasons: Read a pending reason."
QUEUE_LOOK_AT = "The queue, not the machines: Priorities."
CODE = "sha256:6921375a022f…"
CREDENTIAL_LOOK_AT = (
    "The credential has not reached the machine: open the credential to see whether the "
    "machine could fetch it."
)


def pending(reason: str, wait: Wait) -> Waiting:
    return Waiting("Pending", reason, wait)


@pytest.mark.parametrize(
    ("run", "workers", "kind", "look_at"),
    [
        (
            pending("No machine fits: local has no ready machine", Wait.MACHINES),
            [],
            FailureKind.MACHINES,
            MACHINES_LOOK_AT,
        ),
        (
            pending(
                "Gang cannot be placed whole: room for 1 of 2 workers of 4 GPUs", Wait.MACHINES
            ),
            [],
            FailureKind.MACHINES,
            MACHINES_LOOK_AT,
        ),
        (
            # issue 36: an image run where no machine runs containers (each machine's reason:
            # "runs processes, not containers: the run names an image")
            pending(
                "No machine runs containers: this cluster's agents run processes; drop image or "
                "add a machine with --executor docker",
                Wait.CONTAINERS,
            ),
            [],
            FailureKind.MACHINES,
            MACHINES_LOOK_AT,
        ),
        (pending("Queued behind llama-70b", Wait.QUEUE), [], FailureKind.QUEUE, QUEUE_LOOK_AT),
        (
            pending("Next to run: waiting for sweep-7 to stop", Wait.QUEUE),
            [],
            FailureKind.QUEUE,
            QUEUE_LOOK_AT,
        ),
        (
            pending("Waits for namespace quota: team-a holds 16 of 16 GPUs", Wait.QUEUE),
            [],
            FailureKind.QUEUE,
            QUEUE_LOOK_AT,
        ),
        (
            pending("Cannot plan workers: 3 workers of 5 GPUs are more than …", Wait.PLAN),
            [],
            FailureKind.PLAN,
            "The GPU count does not split as asked: change machines or the count.",
        ),
        (  # the run says its slowest worker's wait
            Waiting("Preparing", "waiting for external secret hf-token", Wait.SECRET),
            [Waiting("Preparing", "waiting for external secret hf-token", Wait.SECRET)],
            FailureKind.CREDENTIAL,
            CREDENTIAL_LOOK_AT,
        ),
        (
            Waiting("Preparing", "Waiting for drive datasets to be filled", Wait.DRIVE),
            [Waiting("Starting", "Ready; waiting for the rest of its gang", None)],
            FailureKind.DRIVE,
            "The drive: open it to see whether it is reachable or still copying.",
        ),
        (
            Waiting("Pulling", "Pulling image ghcr.io/acme/train:v9: 2.1 GB of 3.4 GB", Wait.IMAGE),
            [],
            FailureKind.PULLING,
            "A large image on a slow link. Later runs on that machine reuse it.",
        ),
        (  # issue 41: its code, fetched from the server while it prepares
            Waiting(
                "Preparing", waiting_sentence(Wait.CODE, CODE, "3.0 MiB of 12.0 MiB"), Wait.CODE
            ),
            [],
            FailureKind.PULLING,
            "Its code (--workdir) on a slow link from the server: leave out what the run does "
            "not need in .astraeusignore. Later runs of the same code on that machine reuse it.",
        ),
        (
            Waiting("Starting", "Starting together: 1 of 2 ready", None),
            [Waiting("Pulling", "Pulling image ghcr.io/acme/train:v9", Wait.IMAGE)],
            FailureKind.BARRIER,
            "One member is still preparing or pulling; after 15 minutes at the barrier the gang "
            "is requeued.",
        ),
        (
            Waiting(
                "Pending",
                "Restarting in 10s (1/10): Worker a-0 failed on gpu-07: Exited with code 1",
                None,
                restart_at=datetime(2026, 10, 1, tzinfo=UTC),
            ),
            [],
            FailureKind.RESTART_LOOP,
            LOOP_LOOK_AT,
        ),
    ],
)
def test_each_wait_of_the_seeds_table_has_its_advice(
    run: Waiting, workers: list[Waiting], kind: FailureKind, look_at: str
) -> None:
    # seed L-61 … L-67: Debug a run that does not start, by what the run and its workers wait
    # for (issue 22: never by the sentence's first words)
    found = waiting(run, workers)
    assert found is not None
    advice, said = found
    assert (advice.kind, advice.look_at, said) == (kind, look_at, run.reason)


def test_a_worker_that_waits_is_advised_when_its_run_says_nothing_yet() -> None:
    run = Waiting("Preparing", "Preparing", None)
    worker = Waiting("Preparing", "waiting for external secret hf-token", Wait.SECRET)
    found = waiting(run, [Waiting("Preparing", "Preparing", None), worker])
    assert found is not None and found[0].kind == FailureKind.CREDENTIAL
    assert found[1] == worker.reason


def test_the_sentences_are_never_read_for_advice() -> None:
    # A restart whose wait the scheduler has since said (the sentence replaced): its kind.
    restarted = Waiting(
        "Pending",
        "No machine fits: local has no ready machine",
        Wait.MACHINES,
        restart_at=datetime(2026, 10, 1, tzinfo=UTC),
    )
    found = waiting(restarted, [])
    assert found is not None and found[0].kind == FailureKind.MACHINES
    # A sentence that reads like a wait with no kind beside it (an agent before waits_for):
    # none; nor a run being stopped.
    old_agent = Waiting("Preparing", "waiting for external secret hf-token", None)
    assert waiting(old_agent, [old_agent]) is None
    stopping = Waiting("Starting", "Stopping: asked by ann", None, stopping=True)
    assert waiting(stopping, []) is None
    assert waiting(Waiting("Pending", "Preempted by higher-priority work (big)", None), []) is None


def test_a_run_going_well_needs_no_advice() -> None:
    running = Waiting("Running", "2 of 2 workers running", None)
    assert waiting(running, [Waiting("Running", "Container running", None)]) is None


# -- issue 20: every failure keeps its story -------------------------------------------------

STALLED_LOOK_AT = (
    "Check the metrics around the failure: memory climbing to the limit, a GPU at 0% (a hang), "
    "network traffic stopping."
)


def test_a_stall_points_at_the_metrics_around_it() -> None:
    # seed "Debug a failed run", step 5: a GPU at 0% (a hang)
    advice = classify(EndCause.STALLED, 143)
    assert (advice.kind, advice.look_at, advice.open) == (
        FailureKind.STALLED,
        STALLED_LOOK_AT,
        "metrics",
    )


@pytest.mark.parametrize(
    ("state", "cause", "reason", "exit_code", "kind", "look_at"),
    [
        # seed L-54
        (
            "Failed",
            EndCause.TIME_LIMIT,
            time_limit_sentence(timedelta(hours=12)),
            143,
            FailureKind.TIME_LIMIT,
            "The time limit: raise it, or checkpoint and resume.",
        ),
        # seed L-56: not the last worker's "Your program: its log."
        (
            "Failed",
            EndCause.RETRY_BUDGET,
            budget_exhausted_sentence(10),
            1,
            FailureKind.RETRY_BUDGET,
            "It failed 10 times in a row: the first failure's cause is in last_failure.",
        ),
        # seed L-57: a preempted run until it runs again, and while it winds down
        (
            "Pending",
            EndCause.PREEMPTED,
            preempted_sentence("llm"),
            None,
            FailureKind.PREEMPTED,
            "Not a failure: it is queued again.",
        ),
        (
            "Running",
            EndCause.PREEMPTED,
            "Preempted by a drain of gpu-07",
            None,
            FailureKind.PREEMPTED,
            "Not a failure: it is queued again.",
        ),
        # seed L-55, restarting after its machine was lost
        (
            "Pending",
            EndCause.MACHINE_LOST,
            "Restarting in 10s (1/10): Worker llama-sft-0 failed on gpu-07: Machine lost: its "
            "lease expired; the gang does not run without it",
            None,
            FailureKind.MACHINE_LOST,
            "The machine, not the run: see Machines troubleshooting. Restarted under its policy.",
        ),
        # a stall loop
        (
            "Pending",
            EndCause.STALLED,
            "Restarting in 40s (3/10): Worker llama-sft-1 stalled on gpu-08: no progress for 5m",
            None,
            FailureKind.STALLED,
            STALLED_LOOK_AT,
        ),
        # a gang's failure: the worker's reason it names
        (
            "Failed",
            EndCause.EXITED,
            "Worker llama-sft-1 failed on gpu-08: Exited with code 1; the gang does not run "
            "without it",
            1,
            FailureKind.PROGRAM,
            "Your program: its log.",
        ),
        (
            "Failed",
            EndCause.OOM_KILLED,
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
def test_a_runs_cause_gives_its_advice(
    state: str,
    cause: EndCause,
    reason: str,
    exit_code: int | None,
    kind: FailureKind,
    look_at: str,
) -> None:
    found = run_advice(state, cause, reason, exit_code, max_restarts=10)
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
    assert run_advice(state, None, reason) is None


def test_a_failed_run_without_a_cause_is_classified_by_its_exit_code() -> None:
    found = run_advice("Failed", None, "Failed", 1)
    assert found is not None and found[0].kind == FailureKind.PROGRAM


def test_a_restarting_run_waits_in_the_restarting_in_a_loop_panel() -> None:
    # seed L-68: Debug a run that does not start, "A worker restarting in a loop"
    reason = (
        "Restarting in 20s (2/10): Worker a-0 failed on m: Exited with code 1; "
        "the gang does not run without it"
    )
    at = datetime(2026, 10, 1, tzinfo=UTC)
    found = waiting(
        Waiting("Pending", reason, None, restart_at=at),
        [Waiting("Pending", "Waiting to be placed again: …", None)],
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
    assert first_failed(EndCause.TIME_LIMIT, None, [], snapshots) == "a-1"
    assert first_failed(EndCause.TIME_LIMIT, None, [], []) is None
    # a worker that failed wins over snapshots
    at = datetime(2026, 10, 1, tzinfo=UTC)
    assert first_failed(EndCause.RETRY_BUDGET, None, [("a-2", at)], snapshots) == "a-2"


@pytest.mark.parametrize(
    ("blocked_at", "reason"),
    [
        (
            "/root",
            "Cannot read /root/train.py: the workload runs as an unprivileged user (uid 2000000), "
            "who may not enter /root",
        ),
        (
            "",
            "Cannot read /root/train.py: the workload runs as an unprivileged user (uid 2000000), "
            "who may not read it",
        ),
        (
            "/root/train.py",
            "Cannot read /root/train.py: the workload runs as an unprivileged user (uid 2000000), "
            "who may not enter it",
        ),
    ],
)
def test_an_unreadable_file_says_which_who_and_what_is_in_the_way(
    blocked_at: str, reason: str
) -> None:
    # issue 36: it ended "Exited with code 2" with a program's advice
    end = End(
        EndCause.UNREADABLE, None, detail="/root/train.py", uid=2000000, blocked_at=blocked_at
    )
    assert end_sentence(end) == reason
    advice = classify(EndCause.UNREADABLE, None)
    assert (advice.kind, advice.open) == (FailureKind.UNREADABLE, "log")
    assert advice.look_at == (
        "The workload runs as an unprivileged user, who may not read the file its reason names: "
        "make it readable to others (chmod o+r on the file, o+x on each folder above it), or put "
        "it on a drive (mounts) or in a folder others may read."
    )


def test_a_permission_denied_in_the_last_lines_is_a_hint_not_a_cause() -> None:
    # The machine could not see the file (inside `bash -c`'s text): the program's advice, with
    # the hint the workload's own output gives; the sentences are not read.
    tail = "python3: can't open file '/root/x.py': [Errno 13] Permission denied\n"
    hinted = classify(EndCause.EXITED, 2, log_tail=tail)
    assert hinted.kind == FailureKind.PROGRAM
    assert hinted.look_at == (
        'Your program: its log. Its last lines say "Permission denied": the workload runs as an '
        "unprivileged user, who may not read a file it opens; make the file readable to others "
        "(chmod o+r, and o+x on each folder above it), or put it on a drive (mounts)."
    )
    assert classify(EndCause.EXITED, 2, log_tail="Traceback …\nKeyError\n").look_at == (
        "Your program: its log."
    )
    # a failed run's advice reads its failed worker's last lines
    found = run_advice("Failed", EndCause.EXITED, "Worker a-0 failed …", 2, log_tail=tail)
    assert found is not None and found[0] == hinted
    # another cause is not a program's: no hint
    assert classify(EndCause.OOM_KILLED, 137, log_tail=tail).kind == FailureKind.OUT_OF_MEMORY
