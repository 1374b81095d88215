"""Leases over real gRPC streams: renewed by each replica for the machines it hears from, in
one statement per interval, never behind the stream's other messages (issue 19)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from astraeus.agent.v1 import agent_pb2
from sqlalchemy import event, select
from sqlalchemy.engine import Engine

from agent.config import AgentConfig
from agent.connection import Agent as RealAgent
from agent.gpus import simulated
from agent.identity import WorkloadUsers
from backend.db import Database
from backend.gateway import streams as agent_streams
from backend.gateway.servicer import AgentService, serve
from backend.machine_identity import service as identity
from backend.machines import service as machines
from backend.models import Machine
from tests.support import FakeClock, Tenancy, local_cluster
from tests.support.agents import stop_serving
from tests.support.sandboxed import process_uids
from tests.support.stream import Agent, _port, hello

LEASE = timedelta(seconds=60)


async def _credential(db: Database, clock: FakeClock, name: str) -> str:
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        joining = await identity.issue_join_token(
            session, clock, organization_id=cluster.organization_id, cluster_id=cluster.id
        )
        issued = await identity.join(session, clock, joining.secret, name)
    return issued.secret


class Replica:
    """One API server replica's agent endpoint."""

    def __init__(self, db: Database, clock: FakeClock, renew_interval: float) -> None:
        self.service = AgentService(
            db, clock, lease=LEASE, poll_interval=0.05, renew_interval_s=renew_interval
        )
        self.address = f"127.0.0.1:{_port()}"
        self.server: Any = None

    async def start(self) -> Replica:
        self.server = await serve(self.service, self.address)
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await stop_serving(self.server, self.service)
            self.server = None


StartReplica = Callable[..., Awaitable[Replica]]


@pytest.fixture
async def start_replica(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> AsyncIterator[StartReplica]:
    started: list[Replica] = []

    async def start(renew_interval: float = 0.05) -> Replica:
        replica = await Replica(db, clock, renew_interval).start()
        started.append(replica)
        return replica

    try:
        yield start
    finally:
        for replica in started:
            await replica.stop()


async def _connect(address: str, db: Database, clock: FakeClock, name: str) -> Agent:
    agent = Agent(address, await _credential(db, clock, name))
    agent.send(hello=hello(name))
    await agent.receive("welcome")
    return agent


async def _machine(db: Database, name: str) -> Machine:
    async with db.read() as session:
        machine = await session.scalar(select(Machine).where(Machine.name == name))
    assert machine is not None
    return machine


async def _check_leases(db: Database, clock: FakeClock) -> None:
    async with db.transaction() as session:
        await machines.expire_leases(session, clock, LEASE)


async def _until_renewed(db: Database, clock: FakeClock, name: str, wait_s: float = 5) -> None:
    deadline = asyncio.get_running_loop().time() + wait_s
    while (await _machine(db, name)).lease_expires_at != clock.now() + LEASE:
        assert asyncio.get_running_loop().time() < deadline, f"{name}'s lease was not renewed"
        await asyncio.sleep(0.02)


@pytest.fixture
def machine_updates() -> Iterator[list[str]]:
    """Every statement that updates the machines table, on any engine."""
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE MACHINES"):
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", count)


async def test_heartbeats_of_many_machines_cost_one_update_per_interval(
    start_replica: StartReplica, db: Database, clock: FakeClock, machine_updates: list[str]
) -> None:
    replica = await start_replica(renew_interval=3600)  # renewed here by hand, once
    names = [f"gpu-{i:02d}" for i in range(6)]
    agents = [await _connect(replica.address, db, clock, name) for name in names]
    try:
        machine_updates.clear()
        clock.advance(seconds=30)
        for _ in range(3):
            last = [agent.send(heartbeat=agent_pb2.Heartbeat()) for agent in agents]
            for agent, up_to in zip(agents, last, strict=True):
                while (await agent.receive("ack")).ack.up_to < up_to:
                    pass
        assert machine_updates == []  # 18 beats, no write
        await replica.service.leases.renew()
        assert len(machine_updates) == 1
        for name in names:
            assert (await _machine(db, name)).lease_expires_at == clock.now() + LEASE
        await replica.service.leases.renew()  # nothing heard since: nothing written
        assert len(machine_updates) == 1
    finally:
        for agent in agents:
            await agent.close()


async def test_a_stream_whose_other_messages_are_slow_keeps_its_lease(
    start_replica: StartReplica, db: Database, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the server reads a machine's messages no faster than it writes them once a few wait
    monkeypatch.setattr(agent_streams, "RECEIVED_MAX", 20)
    replica = await start_replica()
    agent = await _connect(replica.address, db, clock, "gpu-07")
    try:
        samples = [
            agent_pb2.Sample(worker_id=999, metric="task_gpu_utilization_ratio", gpu=0, at_ms=i)
            for i in range(200)
        ]
        for _ in range(3000):  # a flood: each is a transaction of its own
            agent.send(metrics=agent_pb2.MetricBatch(samples=samples))
        clock.advance(seconds=50)
        agent.send(heartbeat=agent_pb2.Heartbeat())
        await _until_renewed(db, clock, "gpu-07")
        stream = replica.service.streams.get((await _machine(db, "gpu-07")).id)
        assert stream is not None and stream.received.qsize() > 0  # still behind the flood
        clock.advance(seconds=20)  # the lease from its Hello is past
        await _check_leases(db, clock)
        machine = await _machine(db, "gpu-07")
        assert (machine.state, machine.reason) == ("ready", "Registered")
    finally:
        await agent.close()


async def test_an_agent_gone_silent_on_an_open_stream_is_lost_after_its_lease(
    start_replica: StartReplica, db: Database, clock: FakeClock
) -> None:
    replica = await start_replica()
    agent = await _connect(replica.address, db, clock, "gpu-07")
    try:
        clock.advance(seconds=30)
        agent.send(heartbeat=agent_pb2.Heartbeat())
        await _until_renewed(db, clock, "gpu-07")
        clock.advance(seconds=59)
        await asyncio.sleep(0.3)  # renewals run; the agent says nothing
        await _check_leases(db, clock)
        assert (await _machine(db, "gpu-07")).state == "ready"
        clock.advance(seconds=2)
        await asyncio.sleep(0.3)
        await _check_leases(db, clock)
        machine = await _machine(db, "gpu-07")
        assert (machine.state, machine.reason) == ("lost", "Machine lost: its lease expired")
        # the stream of a lost machine ends when it is heard again: it must say Hello again
        agent.send(heartbeat=agent_pb2.Heartbeat())
        with pytest.raises(AssertionError, match="the server closed the stream"):
            await agent.receive("never")
    finally:
        await agent.close()


async def test_a_replica_that_dies_lets_its_machines_be_lost_after_the_lease(
    start_replica: StartReplica, db: Database, clock: FakeClock
) -> None:
    first, second = await start_replica(), await start_replica()
    on_first = await _connect(first.address, db, clock, "gpu-01")
    on_second = await _connect(second.address, db, clock, "gpu-02")
    try:
        for step in (20, 20, 20, 20, 5):
            clock.advance(seconds=step)
            on_first.send(heartbeat=agent_pb2.Heartbeat())  # heard by nobody once it is gone
            on_second.send(heartbeat=agent_pb2.Heartbeat())
            await _until_renewed(db, clock, "gpu-02")
            if step == 20 and first.server is not None:
                await _until_renewed(db, clock, "gpu-01")
                await first.stop()  # killed: nothing renews its machines any more
            await _check_leases(db, clock)
        lost, held = await _machine(db, "gpu-01"), await _machine(db, "gpu-02")
        assert (lost.state, lost.reason) == ("lost", "Machine lost: its lease expired")
        assert (held.state, held.reason) == ("ready", "Registered")
    finally:
        await on_first.close()
        await on_second.close()


async def test_the_agent_beats_at_least_thrice_a_lease_whatever_its_heartbeat_setting(
    tenancy: Tenancy,
    db: Database,
    clock: FakeClock,
    tmp_path: Path,
    machine_updates: list[str],
) -> None:
    replica = Replica(db, clock, renew_interval=0.2)
    replica.service.lease = timedelta(seconds=3)  # what its Welcome tells the agent
    await replica.start()
    agent = RealAgent(
        AgentConfig(
            server=replica.address,
            token=await _credential(db, clock, "gpu-07"),
            machine="gpu-07",
            data_dir=tmp_path,
            gpus=simulated(2, "gpu-07"),
            cpu_cores=8,
            memory_bytes=64 * 2**30,
            heartbeat_seconds=60,  # longer than the lease: beats every second instead
            sample_seconds=60,
            users=WorkloadUsers(uids=process_uids()),
        )
    )
    beats: list[float] = []  # when the agent sent each heartbeat
    send = agent.outgoing.send

    def sent(durable: bool = True, **body: Any) -> None:
        if "heartbeat" in body:
            beats.append(time.monotonic())
        send(durable, **body)

    agent.outgoing.send = sent  # type: ignore[method-assign]
    running = asyncio.create_task(agent.run_forever())
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while not replica.service.streams.by_machine:
            assert asyncio.get_running_loop().time() < deadline, "the agent did not join"
            await asyncio.sleep(0.05)
        machine_updates.clear()
        beats.clear()
        # Over two leases and more: about seven beats (one a second), where one a lease would
        # send two. Counted where they are sent: the server's renewals of them, one each, lag
        # behind a loaded machine (CI: one renewal in 3.5 s at load 9, 2026-12-05).
        await asyncio.sleep(7)
        assert len(beats) >= 4, beats
        assert len(machine_updates) >= 2  # heard, and renewed
        assert (await _machine(db, "gpu-07")).state == "ready"
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await replica.stop()


async def test_a_machine_is_last_seen_when_it_was_last_heard_not_when_renewed(
    start_replica: StartReplica, db: Database, clock: FakeClock
) -> None:
    # issue 36: a lost machine is dated at its last contact (its workers fail from then)
    replica = await start_replica(renew_interval=3600)  # renewed here by hand
    agent = await _connect(replica.address, db, clock, "gpu-07")
    try:
        clock.advance(seconds=10)
        last = agent.send(heartbeat=agent_pb2.Heartbeat())
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        heard = clock.now()
        clock.advance(seconds=4)  # the renewal comes later
        await replica.service.leases.renew()
        machine = await _machine(db, "gpu-07")
        assert (machine.last_seen_at, machine.lease_expires_at) == (heard, clock.now() + LEASE)
    finally:
        await agent.close()
