"""Simulated GPUs report a memory figure that follows the workload (issue 20): an even share of
the memory charged to the worker, at most the GPU's own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from agent.gpus import simulated_memory_used
from agent.metrics import group_rss_bytes
from tests.support import WORKLOAD_PYTHON
from tests.support.processes import Cluster

MIB = 2**20


def test_each_gpu_holds_an_even_share_at_most_its_own_memory() -> None:
    assert simulated_memory_used(600 * MIB, 2, 80 * 2**30) == 300 * MIB
    assert simulated_memory_used(600 * MIB, 3, 100 * MIB) == 100 * MIB
    assert simulated_memory_used(0, 2, 80 * 2**30) == 0
    assert simulated_memory_used(600 * MIB, 0, 80 * 2**30) == 0


def test_a_process_groups_resident_memory_is_measured_without_a_control_group() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; x = bytearray(160 * 2**20); time.sleep(30)"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while (group_rss_bytes(child.pid) or 0) < 150 * MIB:
            assert time.monotonic() < deadline, group_rss_bytes(child.pid)
            time.sleep(0.1)
        assert group_rss_bytes(os.getpgrp()) is not None  # this test's own group
    finally:
        child.kill()
        child.wait()
    assert group_rss_bytes(child.pid) is None  # none of its processes left


# Little memory for 6 s, then 300 MiB for 8 s.
GROWS = (
    "import time\n"
    "print('small', flush=True)\n"
    "time.sleep(6)\n"
    "x = bytearray(300 * 2**20)\n"
    "for i in range(0, len(x), 4096):\n"
    "    x[i] = 1\n"
    "print('large', flush=True)\n"
    "time.sleep(8)\n"
)


def test_a_simulated_gpus_memory_follows_the_workload(cluster: Cluster) -> None:
    cluster.agent("m1").start()
    since = int(time.time() * 1000) - 1000
    cluster.submit(
        name="grows", gpus=2, restart_policy="never", command=[WORKLOAD_PYTHON, "-c", GROWS]
    )
    cluster.wait("completed", lambda: cluster.status("grows") == "Completed")
    answer = cluster.get(
        f"/metrics/range?metric=task_gpu_memory_used_bytes&match=run:grows&by=gpu"
        f"&start={since}&end={int(time.time() * 1000)}&step=1s"
    )
    assert sorted(s["labels"]["gpu"] for s in answer["series"]) == ["0", "1"]
    for series in answer["series"]:
        values = [v for _, v in series["points"]]
        # Each of the 2 GPUs holds half of what the worker holds: under 100 MiB at first,
        # 150 MiB or more once it allocated 300 MiB (before: no series at all).
        assert min(values) < 100 * MIB, values
        assert max(values) >= 150 * MIB, values
        assert max(values) < 80 * 2**30
