"""What an agent says it cannot measure per worker, in its Hello (issue 20)."""

from __future__ import annotations

import os
from pathlib import Path

from agent import cgroups
from agent.metrics import CGROUP_METRICS, NETWORK_METRICS, unmeasured
from tests.support.agents import unconnected_agent

NETWORK = ["task_network_receive_bytes_total", "task_network_transmit_bytes_total"]


def test_network_bytes_are_unmeasured_with_either_executor() -> None:
    # Processes share the host's network; containers run on it too (NetworkMode: host).
    assert unmeasured("process", cgroups_available=True) == NETWORK
    assert unmeasured("docker", cgroups_available=True) == NETWORK
    assert list(NETWORK_METRICS) == NETWORK


def test_without_control_groups_a_process_s_cpu_memory_and_oom_kills_are_unmeasured() -> None:
    assert unmeasured("process", cgroups_available=False) == NETWORK + list(CGROUP_METRICS)
    # A container's come from its engine.
    assert unmeasured("docker", cgroups_available=False) == NETWORK


def test_cgroups_are_available_only_where_the_hierarchy_is_writable(tmp_path: Path) -> None:
    assert not cgroups.available(tmp_path)  # neither v2's controllers file nor v1's memory
    (tmp_path / "memory").mkdir()
    assert cgroups.available(tmp_path)
    (tmp_path / "cgroup.controllers").write_text("memory cpu\n")
    assert cgroups.available(tmp_path)
    (tmp_path / "memory").rmdir()
    tmp_path.chmod(0o500)
    try:
        # root writes anywhere; any other user may not write a read-only hierarchy.
        assert cgroups.available(tmp_path) == (os.geteuid() == 0)
    finally:
        tmp_path.chmod(0o700)


def test_the_hello_says_the_executor_and_what_it_cannot_measure(tmp_path: Path) -> None:
    agent = unconnected_agent(tmp_path / "agent", executor="process")
    hello = agent._hello().hello
    assert hello.executor == "process"
    assert list(hello.unmeasured_metrics) == unmeasured("process", cgroups.available())
    assert list(hello.unmeasured_metrics)[:2] == NETWORK
