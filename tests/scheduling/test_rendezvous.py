"""A gang's rendezvous (issue 20): MASTER_ADDR is where the other machines reach rank 0's
machine (its agent's advertised address), MASTER_PORT a port no live run uses there; a start
its agent refused because another program holds the port is placed again on the next one.
Through the services and the database (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from pydantic import ValidationError
from sqlalchemy import select

from agent import rendezvous
from backend.config import Settings
from backend.lifecycle.sentences import EndCause
from backend.machines import service as machines
from backend.machines.service import GpuInfo
from backend.models import AgentCommand, Machine, StateTransition, Worker
from backend.scheduling.rules import MASTER_PORTS, master_port
from tests.lifecycle.world import GIB, LEASE, World
from tests.support import local_cluster


def test_the_first_free_port_counting_from_the_one_after_the_last_attempts() -> None:
    assert master_port(set()) == 29500
    assert master_port({29500, 29501}) == 29502
    assert master_port(set(), previous=29500) == 29501  # never the port just refused
    assert master_port({29501, 29502}, previous=29500) == 29503
    assert master_port(set(), previous=MASTER_PORTS.stop - 1) == 29500  # wraps around
    assert master_port(set(MASTER_PORTS) - {29500}, previous=29500) == 29500
    assert master_port(set(MASTER_PORTS)) == 29500  # all taken: its agent says so


async def machine(world: World, name: str, address: str | None, gpus: int = 8) -> int:
    async with world.db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        row = await machines.register(
            session,
            world.clock,
            cluster_id=cluster.id,
            name=name,
            cpu_cores=64,
            memory_bytes=512 * GIB,
            gpus=[GpuInfo(i, f"GPU-{name}-{i}", "Simulated GPU", 80 * GIB) for i in range(gpus)],
            lease=LEASE,
            address=address,
        )
        return row.id


async def starts(world: World, run: str) -> dict[str, dict[str, Any]]:
    """The latest START of each worker of the run: its Astraeus variables."""
    async with world.db.read() as session:
        rows = await session.execute(
            select(Worker.name, AgentCommand.payload)
            .join(AgentCommand, AgentCommand.worker_id == Worker.id)
            .where(Worker.name.startswith(f"{run}-"), AgentCommand.kind == "start")
            .order_by(AgentCommand.id)
        )
        return {name: dict(payload["astraeus_environment"]) for name, payload in rows}


async def test_master_addr_is_rank_0s_machines_address(world: World) -> None:
    # before: MASTER_ADDR was the machine's name, `local`, which no other machine resolves
    await machine(world, "gpu-07", "10.1.2.3", gpus=1)
    await machine(world, "gpu-08", "10.1.2.4", gpus=1)
    await world.submit(name="ddp", workers=2, gpus=1)
    assert (await world.schedule()).placed == ["ddp"]
    found = await starts(world, "ddp")
    placed = {w.name: w.machine_id for w in await world.workers("ddp")}
    assert len(set(placed.values())) == 2  # one machine each
    async with world.db.read() as session:
        rank0 = await session.get(Machine, placed["ddp-0"])
    assert rank0 is not None and rank0.address in ("10.1.2.3", "10.1.2.4")
    head = rank0.address
    assert [(e["RANK"], e["MASTER_ADDR"], e["MASTER_PORT"]) for e in found.values()] == [
        ("0", head, "29500"),
        ("1", head, "29500"),
    ]


async def test_an_agent_that_does_not_say_leaves_the_machines_name(world: World) -> None:
    await machine(world, "gpu-07", None)
    await world.submit(name="ddp", workers=2, gpus=1)
    await world.schedule()
    assert {e["MASTER_ADDR"] for e in (await starts(world, "ddp")).values()} == {"gpu-07"}


async def test_machines_of_one_address_share_its_ports(world: World) -> None:
    # two agents on one host (as tests run them): their gangs' rank 0 may not share a port
    await machine(world, "a", "127.0.0.1", gpus=2)
    await machine(world, "b", "127.0.0.1", gpus=2)
    await world.submit(name="one", workers=1, gpus=2)  # a machine each: both are rank 0
    await world.submit(name="two", workers=1, gpus=2)
    assert sorted((await world.schedule()).placed) == ["one", "two"]
    heads = {w.machine_id for run in ("one", "two") for w in await world.workers(run)}
    assert len(heads) == 2
    ports = {
        run: {e["MASTER_PORT"] for e in (await starts(world, run)).values()}
        for run in ("one", "two")
    }
    assert sorted(ports.values()) == [{"29500"}, {"29501"}]


async def test_a_port_its_agent_found_taken_is_not_asked_for_again(world: World) -> None:
    await machine(world, "gpu-07", "10.1.2.3")
    await world.submit(name="ddp", workers=2, gpus=1)
    await world.schedule()
    taken = rendezvous.port_taken_reason(29500, "gpu-07")
    await world.report("ddp-0", "exited", attempt=1, cause=EndCause.NOT_STARTED, detail=taken)
    assert (await world.run("ddp")).reason == (
        f"Worker ddp-0 failed on gpu-07: {taken}; the gang does not run without it"
    )
    await world.report("ddp-1", "exited", attempt=1, exit_code=143)  # stopped with the gang
    run = await world.run("ddp")
    assert run.reason.startswith("Restarting in ")
    assert run.restart_at is not None
    world.clock.moment = run.restart_at
    await world.timers()
    assert (await world.schedule()).placed == ["ddp"]
    found = await starts(world, "ddp")
    assert {e["MASTER_PORT"] for e in found.values()} == {"29501"}
    worker = (await world.workers("ddp"))[0]
    assert worker.last_failure is not None
    assert worker.last_failure["reason"] == (
        "MASTER_PORT 29500 is in use on gpu-07 by another program (the next start takes another)"
    )


def test_a_clusters_ports_are_a_setting() -> None:
    assert master_port({31000}, ports=range(31000, 31100)) == 31001
    assert master_port(set(), previous=31099, ports=range(31000, 31100)) == 31000
    assert Settings(master_ports=cast(Any, "31000-31099")).master_ports == (31000, 31099)
    assert Settings().master_ports == (29500, 30499)
    for wrong in ("31000", "80-90", "31099-31000", "a-b"):
        with pytest.raises(ValidationError, match="master_ports"):
            Settings(master_ports=cast(Any, wrong))  # as ASTRAEUS_MASTER_PORTS gives it


async def test_a_port_another_program_holds_is_no_failure_and_burns_no_restart(
    world: World,
) -> None:
    # issue 37 N3: a workload of another workspace squats the MASTER_PORT range; rank 0's agent
    # finds the port taken at START (PORT_TAKEN) and holds one of the kernel's for the gang
    await machine(world, "gpu-07", "10.1.2.3")
    await world.submit(name="ddp", workers=2, gpus=1, restart_policy="never")
    await world.schedule()
    await world.report("ddp-1", "ready", attempt=1)
    await world.report(
        "ddp-0", "exited", attempt=1, cause=EndCause.PORT_TAKEN, detail="29500", offered_port=41234
    )
    taken = (
        "MASTER_PORT 29500 is in use on gpu-07 by another program: the gang is placed again on "
        "another port (not a failure of the run)"
    )
    run = await world.run("ddp")
    assert (run.state, run.reason, run.stop_cause) == ("Starting", taken, "rendezvous")
    await world.report("ddp-1", "exited", attempt=1, cause=EndCause.STOPPED_BEFORE_START)
    run = await world.run("ddp")
    assert (run.state, run.reason, run.cause) == ("Pending", taken, "port_taken")
    assert (run.failures_in_row, run.restart_at) == (0, None)  # never: yet it goes again
    workers = await world.workers("ddp")
    assert [(w.phase, w.restarts, w.last_failure) for w in workers] == [
        ("requeued:rendezvous", 0, None),
        ("requeued:rendezvous", 0, None),
    ]
    assert (await world.schedule()).placed == ["ddp"]
    found = await starts(world, "ddp")
    assert {e["MASTER_PORT"] for e in found.values()} == {"41234"}  # the port its agent held
    await world.start("ddp-0", "ddp-1")
    for rank in (0, 1):
        await world.report(f"ddp-{rank}", "exited", attempt=2, exit_code=0)
    assert (await world.status("ddp"))[0] == "Completed"
    # nothing of it counted as a failure: the wait while it was placed again is waiting
    async with world.db.read() as session:
        phases = await session.scalars(
            select(StateTransition.phase)
            .join(Worker, Worker.id == StateTransition.worker_id)
            .where(Worker.name == "ddp-1")
            .order_by(StateTransition.id)
        )
        seen = list(phases)
    assert seen == [
        "waiting",
        "starting",
        "starting",  # stopped with its gang while still being started (at the barrier)
        "requeued:rendezvous",
        "requeued:rendezvous",
        "restart",
        "running",
        "ended",
    ], seen


async def test_a_rank_0_refused_without_an_offer_takes_the_next_port(world: World) -> None:
    await machine(world, "gpu-07", "10.1.2.3")
    await world.submit(name="ddp", workers=2, gpus=1)
    await world.schedule()
    await world.report("ddp-0", "exited", attempt=1, cause=EndCause.PORT_TAKEN, detail="29500")
    await world.report("ddp-1", "exited", attempt=1, cause=EndCause.STOPPED_BEFORE_START)
    assert (await world.schedule()).placed == ["ddp"]
    found = await starts(world, "ddp")
    assert {e["MASTER_PORT"] for e in found.values()} == {"29501"}


async def test_the_gangs_machines_are_in_its_start(world: World) -> None:
    await machine(world, "gpu-07", "10.1.2.3", gpus=1)
    await machine(world, "gpu-08", "10.1.2.4", gpus=1)
    await world.submit(name="ddp", workers=2, gpus=1)
    await world.schedule()
    async with world.db.read() as session:
        payloads = await session.scalars(
            select(AgentCommand.payload).where(AgentCommand.kind == "start")
        )
        found = [sorted(p["gang_addresses"]) for p in payloads]
    assert found == [["10.1.2.3", "10.1.2.4"]] * 2
