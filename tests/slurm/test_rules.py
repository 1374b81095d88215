"""Slurm's words in Astraeus's (backend/slurm/rules.py): a job's life as runs' transitions;
a pending job's reason in the seed's words (tests/slurm/test_parsing.py: what Slurm prints)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from backend.lifecycle import external
from backend.lifecycle.states import Phase, Wait
from backend.scheduling.rules import ANOTHER_WORKSPACE
from backend.slurm import parsing, rules
from backend.slurm.rules import Ahead, SlurmJob

T = datetime(2026, 12, 3, 11, 0, 0, tzinfo=UTC)


def job(**fields: object) -> SlurmJob:
    base: dict[str, object] = {
        "job_id": "12",
        "name": "train",
        "account": "alpha",
        "partition": "gpu",
        "user": "ana",
        "state": "PENDING",
        "submit": T,
    }
    return SlurmJob(**(base | fields))  # type: ignore[arg-type]


def test_the_gpus_slurm_gave_each_node_and_each_task() -> None:  # issue 25
    assert rules.gres_indexes("gpu:2(IDX:0-1)") == (0, 1)
    assert rules.gres_indexes("gpu:a100:3(IDX:0,2-3),shard:0") == (0, 2, 3)
    assert rules.gres_indexes("gpu:h100:1(IDX:4),gpu:a100:1(IDX:0)") == (0, 4)
    assert rules.gres_indexes("mps:100(IDX:0)") == () == rules.gres_indexes("")
    job = SlurmJob(
        job_id="5",
        name="ddp",
        account="a",
        partition="gpu",
        user="u",
        state="RUNNING",
        submit=T,
        nodes=("n1", "n2"),
        gpu_indexes=((0, 1, 2, 3), (4, 5)),
    )
    # srun's tasks in blocks, --gpus-per-task: each takes its node's next GPUs in rank order
    assert rules.task_gpus(job, {0: "n1", 1: "n1", 2: "n2"}, 2) == {
        0: (0, 1),
        1: (2, 3),
        2: (4, 5),
    }
    assert rules.task_gpus(job, {0: "n3"}, 1) == {}  # a node squeue did not name


def test_a_nodes_slurm_state_is_a_machines_state() -> None:
    n1 = rules.SlurmNode("n1", ("gpu", "debug"), 8, "h100", 64, 0, "mixed", "")
    n2 = rules.SlurmNode("n2", ("gpu",), 0, "GPU", 8, 0, "drained", "maintenance")
    assert rules.machine_state(n1) == ("ready", "Slurm: mixed")
    assert rules.machine_state(n2) == ("draining", "Slurm: drained (maintenance)")
    down = rules.SlurmNode("n3", ("gpu",), 2, "GPU", 8, 0, "idle*", "Not responding")
    assert rules.machine_state(down)[0] == "lost"


def test_a_job_becomes_a_named_run_with_a_worker_per_node() -> None:
    assert rules.run_name(job(name="Train LLaMA 7B!", job_id="12")) == "train-llama-7b-12"
    assert rules.run_name(job(name="sweep", job_id="30_1")) == "sweep-30-1"
    assert rules.run_name(job(name="___", job_id="5")) == "job-5"
    assert len(rules.run_name(job(name="x" * 200, job_id="123456"))) <= 63
    assert rules.worker_gpus(job(node_count=2, gpus=8)) == [4, 4]
    assert rules.worker_gpus(job(node_count=2, gpus=3)) == [2, 1]
    assert rules.worker_gpus(job(node_count=1, gpus=0)) == [0]


def test_a_completed_job_is_waiting_then_held_then_ended_at_slurms_times() -> None:
    done = job(
        state="COMPLETED",
        start=T + timedelta(seconds=5),
        end=T + timedelta(minutes=10),
        nodes=("vm",),
        gpus=2,
        exit_code=0,
    )
    changes = rules.changes(done, ["train-12-0"])
    assert [(c.at, c.state, c.phase, c.held) for c in changes] == [
        (T, "Pending", Phase.WAITING, False),
        (T + timedelta(seconds=5), "Running", Phase.RUNNING, True),
        (T + timedelta(minutes=10), "Completed", Phase.ENDED, False),
    ]
    assert changes[1].run_reason == "1 of 1 worker running"
    assert changes[2].run_reason == "1 of 1 worker completed"


@pytest.mark.parametrize(
    ("state", "extra", "run_state", "worker_reason"),
    [
        ("FAILED", {"exit_code": 3}, "Failed", "Exited with code 3"),
        (
            "OUT_OF_MEMORY",
            {"exit_code": 0},
            "Failed",
            "OOMKilled: the container exceeded its memory limit",
        ),
        (
            "TIMEOUT",
            {"time_limit": timedelta(hours=12)},
            "Failed",
            "Exceeded its time limit of 12h",
        ),
        ("NODE_FAIL", {}, "Failed", "Machine lost: Slurm found its node failed"),
        ("PREEMPTED", {}, "Stopped", "Preempted by higher-priority work (Slurm)"),
        ("CANCELLED", {}, "Stopped", "Stopped: cancelled in Slurm"),
        ("FAILED", {"exit_code": 0, "signal": 9}, "Failed", "Killed by signal 9"),
    ],
)
def test_an_ended_job_says_why_in_the_seeds_words(
    state: str, extra: dict[str, object], run_state: str, worker_reason: str
) -> None:
    ended = job(state=state, start=T, end=T + timedelta(minutes=1), nodes=("vm",), gpus=1, **extra)
    last = rules.changes(ended, ["train-12-0"])[-1]
    assert (last.state, last.worker_reason) == (run_state, worker_reason)
    if run_state == "Failed":
        assert last.run_reason == (
            f"Worker train-12-0 failed on vm: {worker_reason}; the gang does not run without it"
        )


def test_a_job_cancelled_while_pending_never_held_its_gpus() -> None:
    cancelled = job(state="CANCELLED", end=T + timedelta(minutes=3), gpus=2)
    assert [(c.state, c.held) for c in rules.changes(cancelled, ["w-0"])] == [
        ("Pending", False),
        ("Stopped", False),
    ]


def test_pending_reasons_in_the_seeds_words() -> None:
    queued = job(reason="Priority")
    assert rules.pending_reason(queued, 1, Ahead(1, "big-3")) == ("Queued behind big-3", Wait.QUEUE)
    assert rules.pending_reason(queued, 1, Ahead(2, "secret-run-3"))[0] == (
        f"Queued behind {ANOTHER_WORKSPACE}"
    )
    assert rules.pending_reason(queued, 1, Ahead(None, "99"))[0] == (
        "Queued behind a job of another account"
    )
    assert rules.pending_reason(job(reason="Resources"), 1, None) == (
        "Waits for resources: next to run in partition gpu",
        Wait.QUEUE,
    )
    assert rules.pending_reason(job(reason="AssocGrpGRES"), 1, None)[0] == (
        "Waits for namespace quota: Slurm's limit AssocGrpGRES on alpha"
    )
    assert rules.pending_reason(job(reason="ReqNodeNotAvail"), 1, None) == (
        "No machine fits: Slurm says ReqNodeNotAvail in partition gpu",
        Wait.MACHINES,
    )
    assert (
        rules.pending_reason(job(reason="JobHeldUser"), 1, None)[0] == "Held by its user in Slurm"
    )
    assert rules.pending_reason(job(reason="Licenses"), 1, None)[0] == (
        "Waits in Slurm's queue: Licenses"
    )


def test_the_queue_ahead_is_slurms_order_in_each_partition() -> None:
    a = job(job_id="1", priority=10)
    b = job(job_id="2", priority=9)
    c = job(job_id="3", priority=9, submit=T + timedelta(seconds=1))
    other = job(job_id="4", priority=1, partition="cpu")
    ahead = rules.queue_ahead([c, other, b, a])
    assert {k: v.job_id for k, v in ahead.items()} == {"2": "1", "3": "2"}


def test_the_queue_is_newer_than_accounting_but_an_end_is_accountings() -> None:
    accounted = [
        job(job_id="1", state="PENDING"),
        job(job_id="2", state="COMPLETED", start=T, end=T + timedelta(minutes=1)),
    ]
    queued = [
        job(job_id="1", state="RUNNING", start=T, nodes=("vm",)),
        job(job_id="2", state="RUNNING", start=T, nodes=("vm",)),
        job(job_id="3", state="PENDING", reason="Priority"),
        job(job_id="4", state="COMPLETED", start=T, end=T),  # not yet in accounting
    ]
    merged = {j.job_id: j.state for j in rules.merge(accounted, queued)}
    assert merged == {"1": "RUNNING", "2": "COMPLETED", "3": "PENDING"}


def test_a_job_cancelled_before_it_ran_asks_what_the_controller_says() -> None:  # issue 38 F4
    """slurmdbd, told of a job's cancel before its start record (the cancel moments after the
    submission), has it named "allocation", in no partition, submitted at its cancel and
    asking for nothing; the controller still has the job, and what it asked for."""
    cancel = T + timedelta(seconds=4)
    heard_of_its_end = job(
        job_id="7", name="allocation", partition="", state="CANCELLED", submit=cancel, end=cancel
    )
    as_queued = job(job_id="7", state="CANCELLED", gpus=2, node_count=2, start=cancel, end=cancel)
    (merged,) = rules.merge([heard_of_its_end], [as_queued])
    assert (merged.name, merged.partition, merged.submit, merged.gpus, merged.node_count) == (
        "train",
        "gpu",
        T,
        2,
        2,
    )
    assert (merged.state, merged.start, merged.end) == ("CANCELLED", None, cancel)
    # what accounting has whole is kept: a job that ran is accounting's alone
    ran = job(job_id="8", state="CANCELLED", start=T, end=cancel, gpus=1, nodes=("vm",))
    (kept,) = rules.merge([ran], [replace(ran, gpus=4, name="renamed")])
    assert (kept.gpus, kept.name) == (1, "train")


# What sacct --json --jobs=16 printed of array 16 ("--array=1-3%1") as its last task, 16_3,
# began (cut): slurmdbd had the task's start, not yet its record; the task's id is the array's.
LAST_TASK_BEGUN = {
    "account": "alpha",
    "allocation_nodes": 0,
    "array": {
        "job_id": 0,
        "limits": {"max": {"running": {"tasks": 0}}},
        "task": None,
        "task_id": None,
    },
    "het": {"job_id": 0, "job_offset": None},
    "job_id": 16,
    "name": "allocation",
    "nodes": "vm",
    "partition": "",
    "priority": 0,
    "state": {"current": "PENDING", "reason": "None"},
    "exit_code": {"status": "SUCCESS", "return_code": 0},
    "time": {
        "elapsed": 0,
        "eligible": 0,
        "end": 0,
        "start": 1796434583,
        "submission": 1796434578,
        "limit": 0,
    },
    "tres": {"allocated": [], "requested": []},
    "user": "root",
}


def test_a_job_slurmdbd_only_heard_began_is_read_once_its_record_comes() -> None:  # issue 38
    """slurmdbd hears a job began before it has the job's record: sacct lists it meanwhile
    named "allocation", in no partition, asking for nothing, an array's last task under the
    array's id (the CI's import made a run made of array 34's pending tasks, "34", Completed
    from it). Left for the next import: a job still queued is the queue's meanwhile; one
    cancelled before it ran is kept (slurmdbd may only ever hear of its end)."""
    read = parsing.parse_sacct({"errors": [], "jobs": [LAST_TASK_BEGUN]})
    (stub,) = read.found
    assert (stub.job_id, stub.partition, stub.start is not None) == ("16", "", True)
    tasks = [job(job_id=f"16_{k}", state="COMPLETED", start=T, end=T) for k in (1, 2)]
    assert rules.without_stubs([*tasks, stub]) == tasks
    assert rules.without_stubs([replace(stub, state="COMPLETED", end=T)]) == []
    # a plain job's: the queue's record of it stands
    began = replace(stub, job_id="17")
    running = job(job_id="17", state="RUNNING", start=T, nodes=("vm",), gpus=2)
    (merged,) = rules.merge(rules.without_stubs([began]), [running])
    assert (merged.name, merged.partition, merged.gpus) == ("train", "gpu", 2)
    # a job cancelled before it ran: kept, unless its id is an array's
    cancelled = job(job_id="18", name="allocation", partition="", state="CANCELLED", end=T)
    assert rules.without_stubs([cancelled]) == [cancelled]
    array_task = job(job_id="18_1", state="CANCELLED", end=T)
    assert rules.without_stubs([cancelled, array_task]) == [array_task]


def test_an_instance_requeued_within_the_second_it_started_holds_nothing_more() -> None:  # 38
    """Slurm's times are whole seconds: an instance started and requeued within one second
    (start = end) held its GPUs for no time, its restart's gap included (else the ledger
    would be a millisecond over sacct)."""
    at = [T + timedelta(seconds=s) for s in range(0, 100, 10)]
    first = job(job_id="5", state="REQUEUED", start=at[1], end=at[2], nodes=("vm",), gpus=1)
    second = job(job_id="5", state="REQUEUED", submit=at[3], start=at[4], end=at[4], gpus=1)
    third = job(job_id="5", state="RUNNING", submit=at[5], start=at[6], nodes=("vm",), gpus=1)
    (merged,) = rules.merge([third, second, first], [])
    steps = [(c.at, c.phase) for c in rules.changes(merged, ["w-0"])]
    assert steps[3:7] == [
        (at[4], Phase.RESTART),
        (at[4], Phase.RUNNING),  # not at[4] + RESTART_GAP: past its end
        (at[4], Phase.REQUEUED_ADMIN),
        (at[6], Phase.RESTART),
    ]
    assert steps[7] == (at[6] + rules.RESTART_GAP, Phase.RUNNING)


def test_a_job_accounting_has_ended_without_its_end_is_read_again_later() -> None:  # 38
    """slurmdbd, back after being down, has a job COMPLETED with its end Unknown for seconds:
    it is not written until accounting has when it ended."""
    unknown = job(job_id="9", state="COMPLETED", start=T, nodes=("vm",), gpus=1)
    assert rules.merge([unknown], []) == []
    assert rules.merge([unknown], [replace(unknown, state="COMPLETED")]) == []
    known = replace(unknown, end=T + timedelta(seconds=2))
    assert [j.end for j in rules.merge([known], [])] == [known.end]


def submission(**fields: object) -> rules.Submission:
    base: dict[str, object] = {
        "run_key": "r7Kq2",
        "run": "ddp",
        "account": "nlp",
        "partition": "gpu",
        "workers": 2,
        "gpus": 1,
        "cpus": 4,
        "memory_mb": 16 * 1024,
        "command": ("python", "train.py", "--name", "it's"),
        "environment": (("HF_HOME", "/data/hf cache"),),
        "time_limit": timedelta(hours=2, seconds=1),
        "priority": 70,
        "run_dir": "/shared/astraeus/run-7",
        "python": "/opt/astraeus/bin/python",
        "operator": True,
    }
    return rules.Submission(**(base | fields))  # type: ignore[arg-type]


def test_a_run_is_one_batch_job_whose_tasks_are_its_workers() -> None:  # issue 25
    script = rules.batch_script(submission())
    assert script.splitlines() == [
        "#!/bin/bash",
        "#SBATCH --job-name=ddp",
        "#SBATCH --account=nlp",
        "#SBATCH --ntasks=2",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --output=/shared/astraeus/run-7/slurm-%j.out",
        "#SBATCH --comment=astraeus-run-r7Kq2",  # (its shown id: the number is the install's)
        "#SBATCH --requeue",
        "#SBATCH --nice=-20000",
        "#SBATCH --partition=gpu",
        "#SBATCH --gpus-per-task=1",
        "#SBATCH --mem-per-cpu=4096M",
        "#SBATCH --time=121",
        "",
        "export HF_HOME='/data/hf cache'",
        "exec srun --kill-on-bad-exit=1 /opt/astraeus/bin/python -m agent.slurm_task "
        "--run-dir /shared/astraeus/run-7 --run ddp -- "
        "python train.py --name 'it'\"'\"'s'",
    ]
    bare = rules.batch_script(
        submission(partition=None, gpus=0, memory_mb=None, time_limit=None, priority=50)
    )
    assert "--partition" not in bare and "--gpus-per-task" not in bare
    assert "--time" not in bare and "#SBATCH --nice=0" in bare
    # only a Slurm operator may lower a nice below 0
    assert "#SBATCH --nice=0" in rules.batch_script(submission(operator=False, priority=90))
    assert "#SBATCH --nice=30000" in rules.batch_script(submission(priority=20))


def test_the_first_failure_is_the_earliest_rank_to_fail_of_its_own() -> None:  # issue 25
    def end(rank: int, seconds: int, code: int, sig: int | None = None) -> external.TaskEnd:
        return external.TaskEnd(rank, "n1", T + timedelta(seconds=seconds), code, sig, "")

    # rank 0 was killed by Slurm first (--kill-on-bad-exit races the report): a consequence
    ends = [end(0, 1, 137, 9), end(1, 2, 3), end(2, 3, 1)]
    first = external.first_failure(ends)
    assert first is not None and first.rank == 1
    assert external.task_end_sentence(first) == "Exited with code 3"
    assert external.first_failure([end(0, 1, 0), end(1, 2, 0)]) is None
    only_killed = external.first_failure([end(0, 4, 143, 15), end(1, 2, 137, 9)])
    assert only_killed is not None and only_killed.rank == 1
    assert external.task_end_sentence(only_killed) == "Killed by signal 9"


def test_a_requeued_job_runs_waits_again_and_runs_as_astraeus_transitions() -> None:  # 25, 38
    at = [T + timedelta(seconds=s) for s in range(0, 100, 10)]
    first = job(job_id="5", state="REQUEUED", start=at[1], end=at[2], nodes=("vm",), gpus=1)
    second = job(job_id="5", state="RUNNING", submit=at[3], start=at[4], nodes=("vm",), gpus=1)
    (merged,) = rules.merge([second, first], [])  # sacct --duplicates, in either order
    assert merged.state == "RUNNING" and merged.previous == (
        rules.Instance(at[1], at[2], "REQUEUED", ("vm",)),
    )
    steps = [(c.at, c.state, c.phase, c.held) for c in rules.changes(merged, ["w-0"])]
    assert steps == [
        (at[0], "Pending", Phase.WAITING, False),  # submitted with its first instance
        (at[1], "Running", Phase.RUNNING, True),
        (at[2], "Pending", Phase.REQUEUED_ADMIN, False),  # `scontrol requeue`: no one's loss
        (at[4], "Starting", Phase.RESTART, True),  # placed again
        (at[4] + rules.RESTART_GAP, "Running", Phase.RUNNING, True),
    ]
    # while the instance's processes end, accounting's record (queued again) is the newer
    (ending,) = rules.merge([first], [job(job_id="5", state="COMPLETING", start=at[1])])
    assert ending.state == "PENDING" and ending.previous
    # waiting again, as the queue and accounting both say
    waiting = rules.merge([first], [job(job_id="5", state="PENDING", reason="BeginTime")])
    assert [(c.state, c.phase) for c in rules.changes(waiting[0], ["w-0"])] == [
        ("Pending", Phase.WAITING),
        ("Running", Phase.RUNNING),
        ("Pending", Phase.REQUEUED_ADMIN),
    ]
    # requeued off a node that is draining: the seed's preemption ("a drain")
    drained = rules.changes(merged, ["w-0"], frozenset({"vm", "other"}))[2]
    assert (drained.phase, drained.run_reason) == (
        Phase.REQUEUED_PREEMPTION,
        "Requeued in Slurm (scontrol requeue): node vm is draining",
    )
    assert rules.changes(merged, ["w-0"], frozenset({"other"}))[2].phase == Phase.REQUEUED_ADMIN
    lost = rules.requeue_change(at[2], "NODE_FAIL")
    assert (lost.phase, lost.run_reason) == (
        Phase.REQUEUED_FAILURE,
        "Machine lost: Slurm found its node failed",
    )
    assert rules.requeue_change(at[2], "PREEMPTED").run_reason == (
        "Preempted by higher-priority work (Slurm)"
    )


def test_a_rank_that_died_of_its_lost_peer_is_not_the_first_failure() -> None:  # issue 25
    # rank 0 hears rank 1's sockets close and aborts before rank 1's process is gone
    heard = external.TaskEnd(0, "n1", T, 1, None, "RuntimeError: Connection closed by peer\n")
    crashed = external.TaskEnd(1, "n1", T + timedelta(milliseconds=300), 3, None, "giving up\n")
    first = external.first_failure([heard, crashed])
    assert first is not None and first.rank == 1
    assert external.peer_lost(heard) and not external.peer_lost(crashed)
