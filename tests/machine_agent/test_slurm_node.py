"""A Slurm node's agent reading its node (issue 25, agent/slurm_node.py, agent/confined.py,
agent/log_copy.py): a job's processes from `scontrol listpids`, the group Slurm put them in, a
run folder's files opened without following a link a job put there, and a log copied with
its writes' times."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent import confined
from agent.log_copy import CUT_BACK, LogCopy
from agent.logs import TIME, WorkerLog
from agent.slurm_node import (
    ProcessSet,
    TaskPid,
    batch_process,
    job_group,
    memory_limit,
    of_worker,
    parse_listpids,
)

# As Slurm 22.05's `scontrol listpids` printed it here for a batch job of two tasks (srun -n2).
LISTPIDS = """PID      JOBID    STEPID   LOCALID GLOBALID
6563     7        0        0       0
6564     7        0        1       1
6547     7        batch    0       0
6551     7        batch    -       -
6548     7        batch    -       -
7001     8        extern   0       0
"""


def test_listpids_is_read_as_each_process_of_each_job() -> None:
    found = parse_listpids(LISTPIDS)
    assert found[:3] == [
        TaskPid(6563, "7", "0", 0),
        TaskPid(6564, "7", "0", 1),
        TaskPid(6547, "7", "batch", 0),
    ]
    assert found[3] == TaskPid(6551, "7", "batch", None)
    assert len(found) == 6


def test_a_worker_is_its_task_in_the_job_steps_or_the_whole_job() -> None:
    found = parse_listpids(LISTPIDS)
    # a submitted run's rank 1: its task in the srun step, never the batch step's rank 0
    assert [p.pid for p in of_worker(found, "7", 1)] == [6564]
    assert [p.pid for p in of_worker(found, "7", 0)] == [6563]
    # an imported job's part on this node: every process of the job
    assert [p.pid for p in of_worker(found, "7", None)] == [6563, 6564, 6547, 6551, 6548]
    assert of_worker(found, "9", None) == []
    assert batch_process(found, "7") == 6547
    assert batch_process(found, "8") is None


def _proc(root: Path, pid: int, cgroup: str, stat_fields: str = "", rss_pages: int = 0) -> None:
    folder = root / str(pid)
    folder.mkdir(parents=True)
    (folder / "cgroup").write_text(cgroup)
    (folder / "stat").write_text(f"{pid} (python3) {stat_fields}\n")
    (folder / "statm").write_text(f"1000 {rss_pages} 0 0 0 0 0\n")


V1 = """9:name=systemd:/
6:freezer:/slurm_vm/uid_0/job_7/step_0
4:memory:/slurm_vm/uid_0/job_7/step_0/task_1
2:cpuacct:/slurm_vm/uid_0/job_7/step_0/task_1
1:cpu:/
"""


def test_the_group_slurm_put_a_task_in_is_its_measure_v1(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    _proc(proc, 6564, V1)
    for controller in ("memory", "cpuacct"):
        (root / controller / "slurm_vm/uid_0/job_7/step_0/task_1").mkdir(parents=True)
    task = job_group(6564, "7", whole_job=False, root=root, proc=proc)
    assert task is not None and task.version == 1
    assert task.memory == root / "memory/slurm_vm/uid_0/job_7/step_0/task_1"
    assert task.cpu == root / "cpuacct/slurm_vm/uid_0/job_7/step_0/task_1"
    job = job_group(6564, "7", whole_job=True, root=root, proc=proc)
    assert job is not None and job.memory == root / "memory/slurm_vm/uid_0/job_7"
    # a process claimed for another job is not measured by this one's group
    assert job_group(6564, "8", whole_job=True, root=root, proc=proc) is None


def test_the_group_of_a_job_on_cgroup_v2(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    path = "system.slice/slurmstepd.scope/job_12/step_0/user/task_0"
    _proc(proc, 50, f"0::/{path}\n")
    (root / path).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    group = job_group(50, "12", whole_job=True, root=root, proc=proc)
    assert group is not None and group.version == 2
    assert group.memory == root / "system.slice/slurmstepd.scope/job_12"


def test_without_slurm_groups_a_worker_is_measured_as_its_processes(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (root / "memory").mkdir(parents=True)
    # proctrack/linuxproc: the task is in slurmd's group, which is no job's
    _proc(proc, 6563, "4:memory:/\n2:cpuacct:/\n", "S 1 6563 " + "0 " * 8 + "300 100 40 10", 5)
    _proc(proc, 6564, "4:memory:/\n2:cpuacct:/\n", "S 1 6564 " + "0 " * 8 + "200 0 0 0", 7)
    assert job_group(6563, "7", whole_job=False, root=root, proc=proc) is None
    processes = ProcessSet([6563, 6564, 6999], proc=proc)
    assert processes.pids() == [6563, 6564]
    ticks = os.sysconf("SC_CLK_TCK")
    # each process's own CPU time and its reaped children's (utime, stime, cutime, cstime)
    assert processes.cpu_seconds() == pytest.approx((300 + 100 + 40 + 10 + 200) / ticks)
    assert processes.memory_used() == 12 * os.sysconf("SC_PAGE_SIZE")
    assert processes.oom_kills() is None and processes.memory_peak() is None


def test_a_group_limit_is_the_jobs_memory_limit(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    _proc(proc, 6564, V1)
    folder = root / "memory/slurm_vm/uid_0/job_7"
    folder.mkdir(parents=True)
    group = job_group(6564, "7", whole_job=True, root=root, proc=proc)
    assert group is not None
    (folder / "memory.limit_in_bytes").write_text("314572800\n")
    assert memory_limit(group, 24 * 2**30) == 314572800
    (folder / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # none set
    assert memory_limit(group, 24 * 2**30) is None
    # a task's own group sets none: it is held to its step's and job's
    task = folder / "step_0/task_1"
    task.mkdir(parents=True)
    (task / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (task.parent / "memory.limit_in_bytes").write_text("400000000\n")
    (folder / "memory.limit_in_bytes").write_text("314572800\n")
    (root / "memory/slurm_vm/memory.limit_in_bytes").write_text("100\n")  # above the job's
    one = job_group(6564, "7", whole_job=False, root=root, proc=proc)
    assert one is not None and memory_limit(one, 24 * 2**30) == 314572800


# ---- a job's files, read as root ----


def test_a_link_a_job_puts_in_its_run_folder_is_never_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "run-4" / "logs" / "train-0").mkdir(parents=True)
    (state / "run-4" / "logs" / "train-0" / "current.log").write_text("hello\n")
    secret = tmp_path / "secret"
    secret.write_text("the agent's credential\n")
    folder = confined.open_folder(state, "run-4")
    try:
        fd = confined.open_file(folder, "logs/train-0/current.log")
        assert os.read(fd, 100) == b"hello\n"
        os.close(fd)
        # the log a link to a file of root's
        log = state / "run-4" / "logs" / "train-0" / "current.log"
        log.unlink()
        log.symlink_to(secret)
        with pytest.raises(OSError):
            confined.open_file(folder, "logs/train-0/current.log")
        # its folder a link to another folder holding a current.log
        (state / "run-4" / "logs" / "train-1").symlink_to(tmp_path)
        (tmp_path / "current.log").write_text("another run's\n")
        with pytest.raises(OSError):
            confined.open_file(folder, "logs/train-1/current.log")
        # a FIFO (it would block the agent) and a way out of the folder
        os.mkfifo(state / "run-4" / "0.progress")
        with pytest.raises(OSError):
            confined.open_file(folder, "0.progress")
        with pytest.raises(ValueError):
            confined.open_file(folder, "../run-5/logs")
    finally:
        os.close(folder)
    # the run's folder itself a link (put in place by a job of the same user)
    (state / "run-6").symlink_to(tmp_path)
    with pytest.raises(OSError):
        confined.open_folder(state, "run-6")


# ---- the log copy ----


def _source(folder: Path) -> WorkerLog:
    source = WorkerLog(folder, "train-0")  # as agent.slurm_task writes it
    source.begin()
    return source


def _copy(tmp_path: Path, source: WorkerLog) -> tuple[WorkerLog, LogCopy]:
    copy = WorkerLog(tmp_path / "agent", "41")
    copy.begin()
    return copy, LogCopy(
        copy,
        lambda: os.open(source.current, os.O_RDONLY),
        lambda: os.open(source.current.with_suffix(".times"), os.O_RDONLY),
    )


def test_a_log_is_copied_as_it_grows_with_each_writes_time(tmp_path: Path) -> None:
    source = _source(tmp_path / "node")
    copy, copier = _copy(tmp_path, source)
    assert copier.copy() == 0
    source.append(b"step 1\n", 1_700_000_000_000)
    source.append(b"step 2\nstep", 1_700_000_001_500)
    assert copier.copy() == len(b"step 1\nstep 2\nstep")
    source.append(b" 3\n", 1_700_000_003_000)
    assert copier.copy() == 3
    assert copier.copy() == 0
    text, archived = copy.tail(10, timestamps=True)
    assert not archived
    assert text.splitlines() == [
        "2023-11-14T22:13:20.000Z step 1",
        "2023-11-14T22:13:21.500Z step 2",
        "2023-11-14T22:13:21.500Z step 3",  # a line's time is when it began
    ]
    assert copy.last_written_ms() == 1_700_000_003_000


def test_a_log_cut_back_on_the_node_is_said_in_the_copy(tmp_path: Path) -> None:
    source = _source(tmp_path / "node")
    copy, copier = _copy(tmp_path, source)
    source.append(b"a line\n" * 10, 1_700_000_000_000)
    copier.copy()
    source.begin()  # begun again (as a cut back shrinks it too)
    source.append(b"new\n", 1_700_000_002_000)
    copier.copy()
    source.append(b"after\n", 1_700_000_004_000)
    copier.copy()
    text, _ = copy.tail(3)
    assert text == "a line\n" + CUT_BACK.decode() + "after\n"  # "new" was written meanwhile


def test_a_copy_without_time_records_is_dated_as_copied(tmp_path: Path) -> None:
    output = tmp_path / "slurm-9.out"
    output.write_bytes(b"")
    copy = WorkerLog(tmp_path / "agent", "42")
    copy.begin()
    copier = LogCopy(copy, lambda: os.open(output, os.O_RDONLY))
    with output.open("ab") as f:
        f.write(b"epoch 1\n")
    assert copier.copy() == 8
    assert copy.tail(5)[0] == "epoch 1\n"
    written = copy.last_written_ms()
    assert written is not None and abs(written / 1000 - os.path.getmtime(output)) < 60
    assert TIME.size == 16
