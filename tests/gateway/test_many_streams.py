"""One replica holding many machines' streams (issue 19, the fleet): their commands and their
credentials are looked up for all of them together, a query or two per poll however many
streams there are; a revoked credential still closes its stream within seconds; acknowledging
commands locks them in the order every other writer does; a stopping server ends its streams
at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from astraeus.agent.v1 import agent_pb2
from sqlalchemy import event, select, text

from backend.db import Database
from backend.gateway import repository
from backend.gateway.servicer import AgentService, serve
from backend.lifecycle import service as lifecycle
from backend.machine_identity import service as identity
from backend.models import AgentCommand
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy, local_cluster
from tests.support.stream import Agent, _port, hello, statements

POLL = 0.05


@pytest.fixture
async def service(db: Database, clock: FakeClock, tenancy: Tenancy) -> AgentService:
    return AgentService(db, clock, lease=timedelta(seconds=60), poll_interval=POLL)


@pytest.fixture
async def endpoint(service: AgentService) -> AsyncIterator[str]:
    address = f"127.0.0.1:{_port()}"
    server = await serve(service, address)
    try:
        yield address
    finally:
        service.close_streams()
        await server.stop(grace=1)


async def credentials(db: Database, clock: FakeClock, machines: list[str]) -> dict[str, str]:
    """Each machine's own credential, joined with one join token of as many uses."""
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        joining = await identity.issue_join_token(
            session,
            clock,
            organization_id=cluster.organization_id,
            cluster_id=cluster.id,
            uses=len(machines),
        )
        return {
            m: (await identity.join(session, clock, joining.secret, m)).secret for m in machines
        }


async def connected(address: str, tokens: dict[str, str]) -> dict[str, Agent]:
    agents = {m: Agent(address, token) for m, token in tokens.items()}
    for m, agent in agents.items():
        agent.send(hello=hello(m))
    await asyncio.gather(*(a.receive("welcome") for a in agents.values()))
    return agents


async def test_one_poll_looks_up_every_streams_commands_and_credentials_together(
    endpoint: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    machines = [f"gpu-{i:02d}" for i in range(20)]
    agents = await connected(endpoint, await credentials(db, clock, machines))
    try:
        with statements(db) as seen:
            await asyncio.sleep(2.5)  # ~50 polls, and a credential check or two
        commands = [s for s in seen if "agent_commands" in s]
        checks = [s for s in seen if "machine_credentials" in s]
        # One loop per stream (before): 20 streams x 50 polls = 1 000, and 20 to 40.
        assert 5 <= len(commands) <= 80, len(commands)
        assert 1 <= len(checks) <= 3, len(checks)

        # Every machine gets its own start, from the one loop.
        world = World(db, clock, tenancy)
        await world.submit(name="wide", workers=20, gpus=2)
        assert (await world.schedule()).placed == ["wide"]
        starts = await asyncio.gather(*(a.receive("command") for a in agents.values()))
        by_machine = {m: s.command.start.worker for m, s in zip(agents, starts, strict=True)}
        placed = {w.name: w.machine_id for w in await world.workers("wide")}
        assert sorted(by_machine.values()) == sorted(placed)
        assert len(set(placed.values())) == 20
    finally:
        for a in agents.values():
            await a.close()


async def test_a_commit_in_this_process_that_adds_commands_sends_them_at_once(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """Where every writer of commands runs in the server's process (embedded), the delivery
    polls rarely: the commit that adds commands wakes it (backend/db/commit_signals.py)."""
    service = AgentService(db, clock, lease=timedelta(seconds=60), poll_interval=60)
    address = f"127.0.0.1:{_port()}"
    server = await serve(service, address)
    machines = ["gpu-00", "gpu-01"]
    agents = await connected(address, await credentials(db, clock, machines))
    try:
        await asyncio.sleep(0.2)  # its first look, as the streams opened, is done
        world = World(db, clock, tenancy)
        await world.submit(name="woken", workers=2, gpus=2)
        began = time.monotonic()
        assert (await world.schedule()).placed == ["woken"]
        starts = await asyncio.gather(*(a.receive("command") for a in agents.values()))
        assert time.monotonic() - began < 5  # not the 60 s poll
        assert sorted(s.command.start.worker for s in starts) == ["woken-0", "woken-1"]

        await world.start("woken-0", "woken-1")
        async with db.transaction() as session:  # its commands added one at a time this time
            await lifecycle.stop_run(session, clock, await world.run("woken"), "alice")

        async def stopped(agent: Agent) -> None:
            while (await agent.receive("command")).command.kind != agent_pb2.COMMAND_KIND_STOP:
                pass  # the gang's release came first

        await asyncio.gather(*(stopped(a) for a in agents.values()))
        assert time.monotonic() - began < 10
    finally:
        for a in agents.values():
            await a.close()
        service.close_streams()
        await server.stop(grace=1)


async def test_a_revoked_credential_closes_its_stream_alone_within_seconds(
    endpoint: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    machines = [f"gpu-{i:02d}" for i in range(5)]
    agents = await connected(endpoint, await credentials(db, clock, machines))
    try:
        async with db.transaction() as session:
            cluster = await session.scalar(local_cluster())
            assert cluster is not None
            await identity.revoke_credential(session, clock, cluster, "gpu-03")
        began = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await agents["gpu-03"].receive("never")
        assert time.monotonic() - began < 5  # REVOCATION_CHECK_S and a poll
        assert (caught.value.code(), caught.value.details()) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "This machine's credential was revoked by an organisation admin.",
        )
        for m in ("gpu-00", "gpu-01", "gpu-02", "gpu-04"):  # the others go on
            sent = agents[m].send(heartbeat=agent_pb2.Heartbeat())
            while (await agents[m].receive("ack")).ack.up_to < sent:
                pass
    finally:
        for a in agents.values():
            await a.close()


async def test_closing_the_streams_ends_them_all_at_once(
    service: AgentService, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """What a stopping server does first (backend/app.py): every stream ends now, so the
    gRPC server stops without waiting out its grace on them."""
    address = f"127.0.0.1:{_port()}"
    server = await serve(service, address)
    machines = [f"gpu-{i:02d}" for i in range(30)]
    agents = await connected(address, await credentials(db, clock, machines))
    try:
        began = time.monotonic()
        service.close_streams()
        await server.stop(grace=30)
        assert time.monotonic() - began < 5
        assert service.streams.by_machine == {}
        for a in agents.values():
            with pytest.raises((grpc.aio.AioRpcError, AssertionError)):
                await a.receive("never")  # its stream ended (EOF or an error)
    finally:
        for a in agents.values():
            await a.close()


async def test_acknowledging_locks_commands_in_id_order(
    db: Database, clock: FakeClock, tenancy: Tenancy, database_url: str
) -> None:
    """Another writer that locks a machine's commands in id order (deleting a run) while it
    is acknowledged never deadlocks with it, whatever order the UPDATE's plan finds the rows
    in (here a sequential scan that meets the second command first)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite takes one write lock: no row locks, no deadlock")
    world = World(db, clock, tenancy)
    machine = await world.machine("gpu-07", gpus=2)
    async with db.transaction() as session:
        rows = [
            AgentCommand(
                machine_id=machine,
                worker_name=f"w{i}",
                kind="stop",
                payload={},
                created_at=clock.now(),
            )
            for i in range(2)
        ]
        session.add_all(rows)
        await session.flush()
        first, second = rows[0].id, rows[1].id
    async with db.transaction() as session:  # the first's new version lies after the second
        await session.execute(
            text("UPDATE agent_commands SET payload = '{\"x\": 1}' WHERE id = :id"), {"id": first}
        )

    async with db.engine.connect() as other:
        await other.execute(text("SET lock_timeout = '10s'"))
        await other.execute(
            text("SELECT id FROM agent_commands WHERE id = :id FOR UPDATE"), {"id": first}
        )

        async def acknowledge() -> None:
            async with db.transaction() as session:
                await session.execute(text("SET LOCAL enable_indexscan = off"))
                await session.execute(text("SET LOCAL enable_bitmapscan = off"))
                await repository.ack_commands(session, machine, [first, second], clock.now())

        acking = asyncio.create_task(acknowledge())
        await asyncio.sleep(0.5)  # it waits for the first command's lock
        assert not acking.done()
        # Before, the UPDATE held the second (met first) while it waited: this deadlocked.
        await other.execute(
            text("SELECT id FROM agent_commands WHERE id = :id FOR UPDATE"), {"id": second}
        )
        await other.commit()
        await asyncio.wait_for(acking, 10)
    async with db.read() as session:
        acked = await session.scalars(select(AgentCommand.acked_at).order_by(AgentCommand.id))
        assert all(at is not None for at in acked)


async def test_many_machines_messages_are_written_in_few_transactions(
    endpoint: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """Samples, progress and acknowledgements of many machines arriving together share
    transactions (the replica's writers), each acknowledged once written."""
    machines = [f"gpu-{i:02d}" for i in range(20)]
    agents = await connected(endpoint, await credentials(db, clock, machines))
    world = World(db, clock, tenancy)
    await world.submit(name="wide", workers=20, gpus=2)
    await world.schedule()
    starts = await asyncio.gather(*(a.receive("command") for a in agents.values()))
    commits: list[int] = []
    engine = db.engine.sync_engine

    def committed(conn: Any) -> None:
        # the writes' transactions: not the delivery's polls (a read, which on PostgreSQL
        # ends with a COMMIT too: every 50 ms here, 10 of them under load in CI)
        if not conn.get_execution_options().get("postgresql_readonly"):
            commits.append(1)

    event.listen(engine, "commit", committed)
    try:
        last = {}
        for (m, agent), start in zip(agents.items(), starts, strict=True):
            ack = agent_pb2.CommandAck(command_ids=[start.command.command_id])
            agent.send(command_ack=ack)
            last[m] = agent.send(command_ack=ack)  # again: each machine's two in order
        for m, agent in agents.items():
            while (await agent.receive("ack")).ack.up_to < last[m]:
                pass
        # 40 messages: one transaction each before; the machines' firsts together, then
        # their seconds (each waits for its first), in a few transactions.
        assert len(commits) < 20, len(commits)
        async with db.read() as session:
            acked = list(
                await session.scalars(
                    select(AgentCommand.acked_at).where(AgentCommand.kind == "start")
                )
            )
        assert len(acked) == 20 and all(at is not None for at in acked)
    finally:
        event.remove(engine, "commit", committed)
        for a in agents.values():
            await a.close()


async def test_messages_written_together_are_acknowledged_together(
    endpoint: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """An Ack says "all up to this one": a machine's messages that waited for the writer
    together get one (or a few), not one each, and the last says the last."""
    [agent] = (await connected(endpoint, await credentials(db, clock, ["gpu-00"]))).values()
    try:
        sent = [
            agent.send(progress=agent_pb2.Progress(worker_id=999_999, attempt=1, step=i))
            for i in range(40)
        ]
        acks = []
        while not acks or acks[-1] < sent[-1]:
            acks.append((await agent.receive("ack")).ack.up_to)
        assert acks == sorted(acks) and acks[-1] == sent[-1]
        assert len(acks) < 20, acks
    finally:
        await agent.close()


async def test_a_machines_waiting_reports_are_written_together_in_order(
    endpoint: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """A machine's progress reports that wait for the writer are written together, a few
    transactions for 40 of them (one each before: a machine sending faster than its writer's
    round trips fell behind, its workers' ends queued behind its reports), in order: its
    last step is the last one written."""
    [agent] = (await connected(endpoint, await credentials(db, clock, ["gpu-00"]))).values()
    world = World(db, clock, tenancy)
    await world.submit(name="solo", workers=1, gpus=2)
    assert (await world.schedule()).placed == ["solo"]
    await world.start("solo-0")
    [worker] = await world.workers("solo")
    commits: list[int] = []
    engine = db.engine.sync_engine

    def committed(conn: Any) -> None:
        # the writes' transactions: not the delivery's polls (a read, which on PostgreSQL
        # ends with a COMMIT too: every 50 ms here, 10 of them under load in CI)
        if not conn.get_execution_options().get("postgresql_readonly"):
            commits.append(1)

    event.listen(engine, "commit", committed)
    try:
        at = int(clock.now().timestamp() * 1000) - 60_000  # a minute of steps, in the past
        sent = [
            agent.send(
                progress=agent_pb2.Progress(
                    worker_id=worker.id, attempt=worker.attempt, step=i, at_ms=at + i
                )
            )
            for i in range(1, 41)
        ]
        while (await agent.receive("ack")).ack.up_to < sent[-1]:
            pass
        assert len(commits) < 10, len(commits)
    finally:
        event.remove(engine, "commit", committed)
        await agent.close()
    [worker] = await world.workers("solo")
    assert worker.progress_step == 40
