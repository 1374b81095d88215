"""A worker's CPU in its control group: a ``cpu`` given is its limit; what it reserved is its
share where cores are contended (v2 cpu.weight, v1 cpu.shares), so that a worker without a
limit (no ``cpu`` in its spec: a tenth of a core reserved, issue 36) never takes a worker's
reserved cores from it. Real groups, a real worker started by the process executor."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import cgroups
from agent.engine_answers import create_body
from agent.executor import ProcessWorker
from agent.identity import WorkloadUsers
from agent.logs import WorkerLog
from agent.start import StartSpec

INSTALL = "astraeus-cpu-share-test"


def _cgroups_here() -> bool:
    probe = cgroups.create("probe", INSTALL)
    if probe is None or probe.cpu_limit is None:
        return False
    probe.remove()
    return True


needs_cgroups = pytest.mark.skipif(
    not _cgroups_here(), reason="this machine gives the agent no writable CPU controller"
)


def _cpu(group: cgroups.WorkerCgroup) -> tuple[str, str]:
    """Its limit and its share, as the kernel has them."""
    assert group.cpu_limit is not None
    if group.version == 2:
        limit = (group.cpu_limit / "cpu.max").read_text().split()[0]
        return limit, (group.cpu_limit / "cpu.weight").read_text().strip()
    quota = (group.cpu_limit / "cpu.cfs_quota_us").read_text().strip()
    return quota, (group.cpu_limit / "cpu.shares").read_text().strip()


NO_LIMIT = {1: "-1", 2: "max"}


@pytest.fixture
def group() -> Iterator[cgroups.WorkerCgroup]:
    made = cgroups.create("shares", INSTALL)
    assert made is not None
    try:
        yield made
    finally:
        made.remove()


@needs_cgroups
def test_the_share_follows_the_cores_reserved(group: cgroups.WorkerCgroup) -> None:
    per_core = 100 if group.version == 2 else 1024
    assert group.limit_cpu(None) and group.share_cpu(0.1)
    assert _cpu(group) == (NO_LIMIT[group.version], str(round(0.1 * per_core)))
    assert group.limit_cpu(2) and group.share_cpu(2)
    limit = "200000"
    assert _cpu(group) == (limit, str(2 * per_core))


@needs_cgroups
@pytest.mark.parametrize(("cpu", "reserved"), [(None, 0.1), (2.0, 2.0)])
def test_a_started_worker_has_its_limit_and_its_share(
    tmp_path: Path, cpu: float | None, reserved: float
) -> None:
    spec = StartSpec(attempt=1, command=("sleep", "30"), cpu=cpu, cpu_request=reserved)
    worker = ProcessWorker(41, spec, WorkerLog(tmp_path / "logs", "41"), tmp_path / "w")
    worker.users = WorkloadUsers(switch=False)  # the agent's own user: nothing to allocate
    worker.install = INSTALL
    worker.keep()

    async def started_then_stopped() -> tuple[str, str]:
        await worker.start()
        assert worker.cgroup is not None
        found = _cpu(worker.cgroup)
        await worker.stop()
        return found

    try:
        limit, share = asyncio.run(started_then_stopped())
    finally:
        worker.release()
    group = cgroups.create("probe", INSTALL)
    assert group is not None
    per_core = 100 if group.version == 2 else 1024
    group.remove()
    expected = NO_LIMIT[group.version] if cpu is None else str(round(cpu * 100_000))
    assert (limit, share) == (expected, str(round(reserved * per_core)))


def test_a_container_gets_its_limit_and_its_share_from_the_engine() -> None:
    # the Docker executor: NanoCpus is the limit, CpuShares the share (1024 a core)
    for cpu, reserved, limit in [(None, 0.1, None), (7.5, 7.5, 7_500_000_000)]:
        spec = StartSpec(image="busybox:1.36", cpu=cpu, cpu_request=reserved)
        host = create_body("40", spec, run_folder=Path("/r"), drives=Path("/d"))["HostConfig"]
        assert (host.get("NanoCpus"), host["CpuShares"]) == (limit, round(reserved * 1024))
