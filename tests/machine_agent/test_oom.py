"""OOM kills in a worker's control group, with real processes past a real memory limit (issue 20;
seed L-34, L-52): the kernel killing the worker's main process ends it "OOMKilled", 137; killing
a child while the main process goes on ends nothing, the worker ends as its main process does
(issue 36: it was recorded "Exited with code 137" / "Out of memory"); both are counted in
task_oom_kills_total."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import cgroups, shim
from agent.executor import EndCause, Exit
from agent.logs import WorkerLog
from tests.support import WORKLOAD_PYTHON
from tests.support.processes import Cluster

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 64 * 2**20


def _cgroups_here() -> bool:
    probe = cgroups.create("probe", "astraeus-oom-test")
    if probe is None:
        return False
    probe.remove()
    return True


pytestmark = pytest.mark.skipif(
    not _cgroups_here(),
    reason="this machine gives the agent no writable cgroup hierarchy: no memory limit, no OOM",
)

# Past 64 MiB at once: the kernel kills the worker's main process itself (no child).
HUNGRY = "x = bytearray(400 * 2**20); print(len(x))"
# A child is killed; the main process lives on a little and exits 0.
HUNGRY_CHILD = (
    "import subprocess, sys, time\n"
    "ended = subprocess.run([sys.executable, '-c', 'x = bytearray(400 * 2**20)'])\n"
    "print('child ended', ended.returncode, flush=True)\n"
    "time.sleep(3)\n"
)
# The same child killed, and the main process gives up on its own because of it.
GIVES_UP = (
    "import subprocess, sys\n"
    "ended = subprocess.run([sys.executable, '-c', 'x = bytearray(400 * 2**20)'])\n"
    "sys.exit(1 if ended.returncode else 0)\n"
)


@pytest.fixture
def group() -> Iterator[cgroups.WorkerCgroup]:
    made = cgroups.create("shim-oom", "astraeus-oom-test")
    assert made is not None
    made.limit_memory(LIMIT)
    try:
        yield made
    finally:
        made.kill_all()
        made.remove()


def _shim_runs(tmp_path: Path, group: cgroups.WorkerCgroup, program: str) -> Exit | None:
    """The shim runs ``program`` in ``group`` as the agent starts it; how it recorded its end."""
    folder = tmp_path / "worker"
    folder.mkdir(parents=True)
    spec = {
        "worker": "7",
        "argv": [sys.executable, "-c", program],
        "env": {"PATH": "/usr/bin:/bin"},
        "cwd": str(tmp_path),
        "log_root": str(tmp_path / "logs"),
        "cgroup": {"version": group.version, "memory": str(group.memory), "cpu": None},
        "cgroup_procs": [str(f) for f in group.procs_files()],
        "identity": None,
    }
    (folder / shim.SPEC).write_text(json.dumps(spec))
    WorkerLog(tmp_path / "logs", "7").begin()
    subprocess.run([sys.executable, "-m", "agent.shim", str(folder)], cwd=ROOT, check=True)
    return shim.recorded_exit(folder)


def test_the_main_process_killed_for_memory_ends_the_worker_oom_killed(
    tmp_path: Path, group: cgroups.WorkerCgroup
) -> None:
    assert _shim_runs(tmp_path, group, HUNGRY) == Exit(137, EndCause.OOM_KILLED)
    assert group.oom_kills() == 1


# issue 36
def test_a_child_killed_for_memory_leaves_the_workers_end_its_main_processes(
    tmp_path: Path, group: cgroups.WorkerCgroup
) -> None:
    assert _shim_runs(tmp_path / "a", group, HUNGRY_CHILD) == Exit(0, EndCause.EXITED)
    log, _ = WorkerLog(tmp_path / "a" / "logs", "7").tail(10)
    assert "child ended -9" in log  # the kernel's SIGKILL, seen by the main process
    assert group.oom_kills() == 1
    assert _shim_runs(tmp_path / "b", group, GIVES_UP) == Exit(1, EndCause.EXITED)
    assert group.oom_kills() == 2  # every process killed for memory is counted


def _oom_kills(cluster: Cluster, run: str, since_ms: int) -> list[float]:
    answer = cluster.get(
        f"/metrics/range?metric=task_oom_kills_total&match=run:{run}&agg=max"
        f"&start={since_ms}&end={int(time.time() * 1000) + 1000}&step=1s"
    )
    return [v for series in answer["series"] for _, v in series["points"]]


def test_an_oom_kill_is_counted_and_only_the_main_processes_ends_the_worker(
    cluster: Cluster,
) -> None:
    cluster.agent("m1").start()
    since = int(time.time() * 1000) - 1000
    for name, command in (("hungry", HUNGRY), ("hungry-child", HUNGRY_CHILD)):
        cluster.submit(
            name=name,
            gpus=1,
            memory_bytes=LIMIT,
            restart_policy="never",
            command=[WORKLOAD_PYTHON, "-c", command],
        )
    cluster.wait("hungry failed", lambda: cluster.status("hungry") == "Failed")
    cluster.wait("hungry-child ended", lambda: cluster.status("hungry-child") != "Running")
    [worker] = cluster.workers("hungry")
    assert (worker["state"], worker["reason"], worker["exitCode"]) == (
        "Failed",
        "OOMKilled: the container exceeded its memory limit",
        137,
    )
    # issue 36: before, "Failed", "OOMKilled: …", 137.
    assert cluster.status("hungry-child") == "Completed"
    [child] = cluster.workers("hungry-child")
    assert (child["state"], child["reason"], child["exitCode"]) == (
        "Completed",
        "Exited with code 0",
        0,
    )
    # Before issue 20 the main process's kill had no sample (the group emptied as it died, no
    # look saw it); its end is sampled. A child's kill is counted by the looks and the end.
    for run in ("hungry", "hungry-child"):
        cluster.wait(f"{run}'s kill counted", lambda r=run: 1.0 in _oom_kills(cluster, r, since))
        assert max(_oom_kills(cluster, run, since)) == 1.0
        assert _oom_kills(cluster, run, since)[-1] == 1.0
