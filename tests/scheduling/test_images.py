"""A run naming an image fits only machines whose agent runs containers (issue 20): where none of
the cluster's does, it does not start, and its pending reason says why and what to do."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import select

from backend.db import Database
from backend.gateway.service import GpuInfo
from backend.machines import rules as machine_rules
from backend.machines import service as machines
from backend.models import Machine
from backend.scheduling import service as scheduling
from backend.scheduling.pending_reasons import machine_reasons
from backend.scheduling.rules import NO_CONTAINERS, plan
from tests.lifecycle.world import LEASE, World
from tests.support import local_cluster
from tests.support.scheduling import CLUSTER, NOW, ask, machine

SENTENCE = (
    "No machine runs containers: this cluster's agents run processes; drop image or add a "
    "machine with --executor docker"
)


def test_the_reason_is_the_issue_s_sentence() -> None:
    assert NO_CONTAINERS == SENTENCE


def test_an_image_never_fits_a_cluster_whose_agents_run_processes() -> None:
    hosts = [
        replace(machine(1, "gpu-01"), executor="process"),
        machine(2, "gpu-02"),  # an agent that never said how: host processes
    ]
    decided = plan([ask(7, "pinned", gpus=1)], hosts, [], {}, {}, NOW, cluster=CLUSTER)
    assert list(decided.placements) == [7]  # without an image, as before
    with_image = replace(ask(8, "in-a-box", gpus=1), image=True)
    decided = plan([with_image], hosts, [], {}, {}, NOW, cluster=CLUSTER)
    assert decided.placements == {}
    assert decided.reasons == {8: SENTENCE}
    assert machine_reasons(with_image, hosts) == [
        ("gpu-01", "runs processes, not containers: the run names an image"),
        ("gpu-02", "runs processes, not containers: the run names an image"),
    ]


def test_an_image_goes_to_a_machine_that_runs_containers_even_when_another_fits_tighter() -> None:
    tight = replace(machine(1, "gpu-01", gpus=8, free=[0]), executor="process")
    roomy = replace(machine(2, "gpu-02", gpus=8), executor="docker")
    with_image = replace(ask(8, "in-a-box", gpus=1), image=True)
    decided = plan([with_image], [tight, roomy], [], {}, {}, NOW, cluster=CLUSTER)
    assert [p.machine_name for p in decided.placements[8]] == ["gpu-02"]
    # A gang of two 8-GPU workers: the one container machine has room for one only, ever
    # (seed L-63; issue 36: "Gang cannot be placed whole" held that machine for it for ever).
    gang = replace(ask(9, "gang", gpus=8, workers=2), image=True)
    decided = plan(
        [gang], [roomy, replace(tight, free_gpus=list(range(8)))], [], {}, {}, NOW, cluster=CLUSTER
    )
    assert decided.reasons[9] == (
        "Cannot plan workers: 2 workers of 8 GPUs, 1 core do not fit in the cluster: with "
        "nothing else on them, its machines that run containers have room for 1"
    )
    # A second container machine, busy now: room for one, the gang waits for the other.
    busy = replace(roomy, id=3, name="gpu-03", free_gpus=[0, 1])
    decided = plan([gang], [roomy, busy], [], {}, {}, NOW, cluster=CLUSTER)
    assert decided.reasons[9] == (
        "Gang cannot be placed whole: room for 1 of 2 workers of 8 GPUs, 1 core"
    )


def test_a_hello_naming_an_unknown_executor_or_metric_is_refused_naming_the_field() -> None:
    assert machine_rules.executor_problem("process", ("task_network_receive_bytes_total",)) is None
    assert machine_rules.executor_problem("", ()) is None  # an agent before it said
    assert machine_rules.executor_problem("podman", ()) == (
        "executor must be one of process, docker, slurm (got 'podman')"
    )
    assert machine_rules.executor_problem("docker", ("task_bogus",)) == (
        "unmeasured_metrics[0] is not a metric of this server (got 'task_bogus')"
    )
    twice = ("task_oom_kills_total", "task_oom_kills_total")
    assert machine_rules.executor_problem("docker", twice) == (
        "unmeasured_metrics[1] repeats task_oom_kills_total"
    )


async def register(world: World, name: str, executor: str | None) -> None:
    async with world.db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        await machines.register(
            session,
            world.clock,
            cluster_id=cluster.id,
            name=name,
            cpu_cores=64,
            memory_bytes=512 * 2**30,
            gpus=[
                GpuInfo(i, f"GPU-{name}-{i}", "NVIDIA H100 80GB HBM3", 80 * 2**30) for i in range(8)
            ],
            lease=LEASE,
            executor=executor,
            unmeasured_metrics=["task_network_receive_bytes_total"],
        )


async def test_a_run_naming_an_image_waits_with_the_reason_until_a_docker_machine_joins(
    world: World, db: Database
) -> None:
    await register(world, "gpu-01", "process")
    await world.submit(name="in-a-box", image="ghcr.io/acme/train:1", command=None)
    await world.submit(name="on-the-host", gpus=1)
    result = await world.schedule()
    assert result.placed == ["on-the-host"]
    assert await world.status("in-a-box") == ("Pending", SENTENCE)
    async with db.read() as session:
        row = await session.scalar(select(Machine).where(Machine.name == "gpu-01"))
        assert row is not None
        assert (row.executor, row.unmeasured_metrics) == (
            "process",
            ["task_network_receive_bytes_total"],
        )
        run = await world.run("in-a-box")
        per_machine = await scheduling.pending_reasons(
            session, world.clock, await world.principal(), run
        )
    assert per_machine == [("gpu-01", "runs processes, not containers: the run names an image")]

    await register(world, "gpu-02", "docker")
    result = await world.schedule()
    assert result.placed == ["in-a-box"]
    docker = await _machine_id(db, "gpu-02")  # both workers, though gpu-01 has room
    assert [w.machine_id for w in await world.workers("in-a-box")] == [docker, docker]


async def _machine_id(db: Database, name: str) -> int:
    async with db.read() as session:
        found = await session.scalar(select(Machine.id).where(Machine.name == name))
        assert found is not None
        return found
