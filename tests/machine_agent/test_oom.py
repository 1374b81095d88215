"""An OOM kill of a worker's main process is counted in task_oom_kills_total: a real agent, a real
process past its memory limit in its control group, and the count on a real server (issue 20;
seed L-52)."""

from __future__ import annotations

import time

import pytest

from agent import cgroups
from tests.support import WORKLOAD_PYTHON
from tests.support.processes import Cluster


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
    "subprocess.run([sys.executable, '-c', 'x = bytearray(400 * 2**20)'])\n"
    "time.sleep(3)\n"
)


def _oom_kills(cluster: Cluster, run: str, since_ms: int) -> list[float]:
    answer = cluster.get(
        f"/metrics/range?metric=task_oom_kills_total&match=run:{run}"
        f"&start={since_ms}&end={int(time.time() * 1000) + 1000}&step=1s"
    )
    return [v for series in answer["series"] for _, v in series["points"]]


def test_an_oom_kill_of_the_main_process_is_counted(cluster: Cluster) -> None:
    cluster.agent("m1").start()
    since = int(time.time() * 1000) - 1000
    for name, command in (("hungry", HUNGRY), ("hungry-child", HUNGRY_CHILD)):
        cluster.submit(
            name=name,
            gpus=1,
            memory_bytes=64 * 2**20,
            restart_policy="never",
            command=[WORKLOAD_PYTHON, "-c", command],
        )
    cluster.wait("hungry failed", lambda: cluster.status("hungry") == "Failed")
    cluster.wait("hungry-child ended", lambda: cluster.status("hungry-child") != "Running")
    worker = cluster.workers("hungry")[0]
    assert (worker["reason"], worker["exitCode"]) == (
        "OOMKilled: the container exceeded its memory limit",
        137,
    )
    # Before: the series was empty (the group emptied as the main process died, no look saw
    # it); now its end is sampled.
    cluster.wait(
        "the kill counted", lambda: max(_oom_kills(cluster, "hungry", since), default=0) >= 1
    )
    # A killed child is counted as before.
    cluster.wait(
        "the child's kill counted",
        lambda: max(_oom_kills(cluster, "hungry-child", since), default=0) >= 1,
    )
