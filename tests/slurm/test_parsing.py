"""What Slurm's commands print, read (backend/slurm/parsing.py, issue 38): `sacct --json`,
`squeue --json` and `sinfo --json` as Debian's Slurm 22.05 prints them (the records below are
cut from its output), each record alone: one that cannot be read is set aside, the others read;
a document with errors is the command's failure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from backend.slurm import parsing
from backend.slurm.parsing import Quarantined

T = datetime(2026, 12, 3, 11, 0, 0, tzinfo=UTC)
S = int(T.timestamp())
META = {"plugin": {"type": "openapi/dbv0.0.38"}, "Slurm": {"release": "22.05.8"}}


def gres(count: int, name: str = "gpu") -> dict[str, Any]:
    return {"type": "gres", "name": name, "id": 1001, "count": count}


def accounted(job_id: int, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "job_id": job_id,
        "name": "train",
        "account": "alpha",
        "partition": "gpu",
        "user": "ana",
        "array": {"job_id": 0, "task": None, "task_id": None},
        "het": {"job_id": 0, "job_offset": None},
        "state": {"current": "COMPLETED", "reason": "None"},
        "exit_code": {"status": "SUCCESS", "return_code": 0},
        "time": {"submission": S, "start": S + 5, "end": S + 605, "limit": None, "elapsed": 600},
        "nodes": "vm",
        "allocation_nodes": 1,
        "priority": 4294901759,
        "tres": {
            "allocated": [{"type": "cpu", "name": None, "id": 1, "count": 1}, gres(1)],
            "requested": [{"type": "node", "name": None, "id": 4, "count": 1}, gres(1)],
        },
    }
    return record | fields


SACCT = {
    "meta": META,
    "errors": [],
    "jobs": [
        accounted(
            7,
            name="a|b",
            nodes="gpu[01-02]",
            allocation_nodes=2,
            time={"submission": S, "start": S + 5, "end": S + 605, "limit": 60},
            tres={"allocated": [gres(8)], "requested": [gres(8)]},
        ),
        # Slurm 22.05 reads "SUCCESS 0" for a job that exited 3: sacct's text says "3:0"
        accounted(8, state={"current": "FAILED"}, tres={"allocated": [gres(2, "gpu:h100")]}),
        accounted(
            9,
            state={"current": "PENDING"},
            nodes="None assigned",
            allocation_nodes=0,
            time={"submission": S + 4, "start": 0, "end": 0, "limit": None},
            tres={"allocated": [], "requested": [{"type": "node", "count": 2}, gres(1)]},
        ),
        accounted(
            10,
            state={"current": "CANCELLED"},
            exit_code={"status": "SIGNALED", "return_code": None, "signal": {"signal_id": 15}},
            time={"submission": S + 4, "start": 0, "end": S + 9, "limit": 1440},
        ),
        # an array's task that ran, and its pending tasks (one record: not a job yet)
        accounted(31, array={"job_id": 30, "task": None, "task_id": 1}),
        accounted(
            30,
            array={"job_id": 30, "task": "0x1F8", "task_id": None},
            state={"current": "PENDING"},
            time={"submission": S, "start": 0, "end": 0},
        ),
        accounted(41, het={"job_id": 40, "job_offset": 1}),
        accounted(11, time={"submission": "yesterday"}),  # set aside, the rest read
    ],
}


def test_sacct_json_is_read_with_times_gpus_and_the_texts_exit_codes() -> None:
    exits = parsing.parse_exit_codes(
        "7|2026-12-03T11:00:05|0:0\n8|2026-12-03T11:00:05|3:0\n10|Unknown|0:15\nnot|a|line|x\n"
    )
    read = parsing.parse_sacct(SACCT, exits)
    jobs = {j.job_id: j for j in read.found}
    assert sorted(jobs) == ["10", "30_1", "40+1", "7", "8", "9"]
    assert read.quarantined == [Quarantined("job 11", "not a time: 'yesterday'")]
    done = jobs["7"]
    assert (done.name, done.account, done.partition, done.user) == ("a|b", "alpha", "gpu", "ana")
    assert (done.submit, done.start, done.end) == (
        T,
        T + timedelta(seconds=5),
        T + timedelta(minutes=10, seconds=5),
    )
    assert done.nodes == ("gpu01", "gpu02") and done.node_count == 2 and done.gpus == 8
    assert done.time_limit == timedelta(hours=1) and done.priority == 4294901759
    failed = jobs["8"]
    assert (failed.state, failed.exit_code, failed.signal, failed.gpus) == ("FAILED", 3, 0, 2)
    pending = jobs["9"]
    assert pending.start is None and pending.nodes == () and pending.gpus == 1
    assert pending.node_count == 2 and pending.time_limit is None and pending.end is None
    cancelled = jobs["10"]
    assert cancelled.state == "CANCELLED" and cancelled.start is None and cancelled.signal == 15
    assert cancelled.time_limit == timedelta(days=1)
    # without the text's line, the JSON's own exit code and signal
    alone = {j.job_id: j for j in parsing.parse_sacct(SACCT).found}
    assert (alone["10"].exit_code, alone["10"].signal) == (0, 15)
    assert (alone["8"].exit_code, alone["8"].signal) == (0, 0)


def test_a_document_with_errors_is_the_commands_failure_not_no_jobs() -> None:
    failed = {"meta": META, "errors": [{"error": "x", "description": "Unable to contact"}]}
    with pytest.raises(parsing.SlurmSaidError, match=r"^sacct failed: Unable to contact$"):
        parsing.parse_sacct(failed | {"jobs": []})
    with pytest.raises(parsing.SlurmSaidError, match=r"^squeue failed: "):
        parsing.parse_squeue(failed | {"jobs": []})
    with pytest.raises(parsing.SlurmSaidError, match=r"^sinfo failed: "):
        parsing.parse_sinfo(failed | {"nodes": []})
    with pytest.raises(parsing.BadSlurmOutput, match="no list of jobs"):
        parsing.parse_squeue({"errors": []})
    # sacct --jobs of a job it has not heard of: an answer, none found
    nothing = {"error_number": 9003, "error": "Nothing found with query"}
    assert parsing.parse_sacct({"errors": [nothing], "jobs": []}).found == []


def test_squeue_json_gives_the_live_state_reason_and_priority() -> None:
    document = {
        "errors": [],
        "jobs": [
            {
                "job_id": 2,
                "name": "second",
                "account": "alpha",
                "partition": "gpu",
                "user_name": "ana",
                "job_state": "PENDING",
                "state_reason": "Resources",
                "priority": 4294901758,
                "submit_time": S,
                "start_time": S + 3600,  # an expected start, not a start
                "node_count": 1,
                "tres_req_str": "cpu=1,mem=100M,node=1,billing=1,gres/gpu=2",
                "time_limit": 5,
            },
            {
                "job_id": 31,
                "array_job_id": 30,
                "array_task_id": 1,
                "name": "sweep|1",
                "account": "alpha",
                "partition": "gpu",
                "job_state": "RUNNING",
                "state_reason": "None",
                "submit_time": S,
                "start_time": S + 2,
                "nodes": "vm",
                "node_count": 1,
                "tres_alloc_str": "cpu=1,gres/gpu=1",
                "gres_detail": ["gpu:1(IDX:1)"],
            },
            {  # the array's pending tasks: each is a job once it starts
                "job_id": 30,
                "array_job_id": 30,
                "array_task_id": None,
                "array_task_string": "2-8%1",
                "job_state": "PENDING",
                "submit_time": S,
            },
            {"job_id": 33, "job_state": "PENDING", "submit_time": S, "name": 5},
            {"job_id": 42, "het_job_id": 41, "het_job_offset": 1, "submit_time": S},
        ],
    }
    read = parsing.parse_squeue(document)
    pending, running, part = read.found
    assert part.job_id == "41+1"  # as sacct names it
    assert read.quarantined == [Quarantined("job 33", "name is not text: 5")]
    assert (pending.gpu_indexes, running.gpu_indexes) == ((), ((1,),))
    assert (pending.state, pending.reason, pending.start, pending.gpus) == (
        "PENDING",
        "Resources",
        None,
        2,
    )
    assert pending.time_limit == timedelta(minutes=5)
    assert running.job_id == "30_1" and running.nodes == ("vm",) and running.name == "sweep|1"
    assert running.start == T + timedelta(seconds=2)


def node(name: str, **fields: Any) -> dict[str, Any]:
    record = {
        "name": name,
        "partitions": ["gpu", "debug"],
        "gres": "gpu:h100:8(S:0-1)",
        "cpus": 64,
        "real_memory": 512000,
        "state": "mixed",
        "state_flags": [],
        "reason": "",
    }
    return record | fields


def test_sinfo_json_gives_each_node_its_partitions_and_sinfos_state() -> None:
    document = {
        "errors": [],
        "nodes": [
            node("n1"),
            node("n2", gres="(null)", state="idle", state_flags=["DRAIN"], reason="a|b c"),
            node("n3", state="idle", state_flags=["NOT_RESPONDING"]),
            node("n4", state="allocated", state_flags=["DRAIN"]),
            node("n5", cpus="many"),
        ],
    }
    read = parsing.parse_sinfo(document)
    n1, n2, n3, n4 = read.found
    assert read.quarantined == [Quarantined("node n5", "not a number: 'many'")]
    assert n1.partitions == ("gpu", "debug") and (n1.gpus, n1.gpu_model) == (8, "h100")
    assert n1.memory_bytes == 512000 * 1024 * 1024 and n1.cpus == 64 and n1.state == "mixed"
    assert (n2.state, n2.reason, n2.gpus) == ("drained", "a|b c", 0)
    assert (n3.state, n4.state) == ("idle*", "draining")


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("vm", ("vm",)),
        ("gpu[01-03,07],cpu1", ("gpu01", "gpu02", "gpu03", "gpu07", "cpu1")),
        ("a[8-10]b", ("a8b", "a9b", "a10b")),
        ("None assigned", ()),
    ],
)
def test_host_lists_expand(expression: str, names: tuple[str, ...]) -> None:
    assert parsing.hostnames(expression) == names


def test_tres_counts_untyped_gpus_else_the_typed_ones_summed() -> None:
    assert parsing.tres_gpus("cpu=1,gres/gpu=2,mem=100M") == 2
    assert parsing.tres_gpus("cpu=1,gres/gpu=4,gres/gpu:a100=4") == 4
    assert parsing.tres_gpus("gres/gpu:a100=2,gres/gpu:v100=1") == 3
    assert parsing.tres_gpus("cpu=4,mem=1G") == 0


def test_sacct_is_never_asked_for_a_pending_range() -> None:  # issue 38 F1
    assert parsing.askable(["12", "6_3", "40+1", "6_[2-8%1]", "6-2", ""]) == ["12", "6_3", "40+1"]


def test_ids_that_name_no_job_of_its_own() -> None:  # issue 38 F1
    answered = ["6_1", "6_2", "12", "40+1"]
    asked = ["6", "6_[3-8%1]", "12", "13", "40+1", "6_3"]
    assert parsing.not_jobs(asked, answered) == ["6", "6_[3-8%1]"]


def test_a_job_cancelled_before_it_ran_has_no_start() -> None:  # issue 38 F4
    # 22.05 dates a job cancelled while held (or before its BeginTime) started and ended at
    # its cancel, on no node: it never ran, and holds nothing
    held = accounted(
        12,
        state={"current": "CANCELLED", "reason": "None"},
        nodes="None assigned",
        allocation_nodes=0,
        time={"submission": S, "start": S + 9, "end": S + 9, "eligible": 0, "limit": None},
        tres={"allocated": [], "requested": [gres(1)]},
    )
    (job,) = parsing.parse_sacct({"meta": META, "errors": [], "jobs": [held]}).found
    assert (job.state, job.start, job.end, job.nodes) == (
        "CANCELLED",
        None,
        T + timedelta(seconds=9),
        (),
    )
    assert job.gpus == 1
