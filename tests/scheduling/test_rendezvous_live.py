"""The real agent against the real server side (one event loop): the address it advertises
by default, and rank 0's MASTER_PORT held by another program on its machine (issue 20)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select, update

from agent.config import AgentConfig
from agent.connection import Agent
from agent.gpus import simulated
from agent.identity import WorkloadUsers
from backend.db import Database
from backend.gateway.servicer import AgentService
from backend.logs.service import WorkerRef
from backend.machine_identity import service as identity
from backend.models import Machine, Run
from tests.lifecycle.world import World
from tests.support import WORKLOAD_PYTHON, FakeClock, Tenancy, local_cluster
from tests.support.agents import agent_endpoint
from tests.support.sandboxed import process_uids

PRINTS = "import os; print(os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], flush=True)"


@pytest.fixture
async def endpoint(db: Database, clock: FakeClock) -> AsyncIterator[tuple[AgentService, str]]:
    async with agent_endpoint(db, clock) as served:
        yield served


async def credential(db: Database, clock: FakeClock) -> str:
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        joining = await identity.issue_join_token(
            session, clock, organization_id=cluster.organization_id, cluster_id=cluster.id
        )
        return (await identity.join(session, clock, joining.secret, "gpu-07")).secret


async def until(what: str, check: object, seconds: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"waited for {what}"
        await asyncio.sleep(0.05)


def hold(port: int) -> socket.socket | None:
    """Another program listening on ``port`` (None: one does already)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen()
    except OSError:
        sock.close()
        return None
    return sock


async def test_a_taken_master_port_is_refused_and_the_gang_starts_on_the_port_held_for_it(
    endpoint: tuple[AgentService, str],
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    tmp_path: Path,
) -> None:
    service, address = endpoint
    config = AgentConfig(
        server=address,
        token=await credential(db, clock),
        machine="gpu-07",
        data_dir=tmp_path,
        gpus=simulated(2, "gpu-07"),
        cpu_cores=8,
        memory_bytes=64 * 2**30,
        heartbeat_seconds=1,
        sample_seconds=0.2,
        users=WorkloadUsers(uids=process_uids()),
    )
    agent = asyncio.create_task(Agent(config).run_forever())
    # Ports far from those of the tests' servers (tests/e2e/live.py) and of the other tests
    # here: its "previous" port is 30400, so its first start asks for 30401; its agent then
    # holds one the kernel picks for it.
    other = hold(30401)
    world = World(db, clock, tenancy)
    try:

        async def joined() -> bool:
            async with db.read() as session:
                return bool(await session.scalar(select(Machine.address)))

        await until("the machine", joined)
        async with db.read() as session:
            # no --advertise-address: the local end of its route to the server
            assert await session.scalar(select(Machine.address)) == "127.0.0.1"
        await world.submit(name="ddp", workers=2, gpus=1, command=[WORKLOAD_PYTHON, "-c", PRINTS])
        async with db.transaction() as session:
            await session.execute(update(Run).where(Run.name == "ddp").values(master_port=30400))
        await world.schedule()

        async def placed_again() -> bool:
            run = await world.run("ddp")
            return run.state == "Pending" and run.cause == "port_taken"

        # issue 37 N3: another program's port is not the run's failure, and burns no restart
        await until("the refused start", placed_again)
        run = await world.run("ddp")
        assert run.reason == (
            "MASTER_PORT 30401 is in use on gpu-07 by another program: the gang is placed "
            "again on another port (not a failure of the run)"
        )
        assert (run.restart_at, run.failures_in_row) == (None, 0)
        assert [w.last_failure for w in await world.workers("ddp")] == [None, None]
        offered = run.master_port  # held by the agent since, for the gang's next start
        assert offered is not None and offered not in range(30400, 30403)
        assert (await world.schedule()).placed == ["ddp"]

        async def completed() -> bool:
            return (await world.run("ddp")).state == "Completed"

        await until("completed", completed)
        rank1 = (await world.workers("ddp"))[1]
        async with db.read() as session:
            machine_id = await session.scalar(select(Machine.id))
        assert machine_id is not None
        tail = await service.tail(machine_id, WorkerRef(rank1.id, rank1.name), 5, 2**20, wait_s=5)
        assert tail is not None and tail.text == f"127.0.0.1 {offered}\n"
    finally:
        if other is not None:
            other.close()
        agent.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await agent
