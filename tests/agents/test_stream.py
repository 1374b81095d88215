"""The agent protocol's server side, spoken to over a real gRPC channel on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import pytest
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc
from sqlalchemy import select

from backend.access import service as access
from backend.agents.stream import AgentService, serve
from backend.db import Database
from backend.models import AgentCommand, Cluster, Gpu, Machine
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def endpoint(db: Database, clock: FakeClock, tenancy: Tenancy) -> AsyncIterator[str]:
    service = AgentService(db, clock, lease=timedelta(seconds=60), poll_interval=0.05)
    address = f"127.0.0.1:{_port()}"
    server = await serve(service, address)
    try:
        yield address
    finally:
        await server.stop(grace=0)


@pytest.fixture
async def machine_token(db: Database, clock: FakeClock, tenancy: Tenancy) -> str:
    async with db.transaction() as session:
        cluster = await session.scalar(select(Cluster).where(Cluster.name == "local"))
        assert cluster is not None
        issued = await access.issue_agent_token(
            session, clock, organization_id=cluster.organization_id, cluster_id=cluster.id
        )
    return issued.secret


class Agent:
    """A client speaking the protocol by hand, to test the server's side of it."""

    def __init__(self, address: str, token: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.outgoing: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
        self.ids = iter(range(1, 10_000))
        stub = agent_pb2_grpc.AgentStub(self.channel)
        self.call = stub.Connect(self._messages(), metadata=(("authorization", f"Bearer {token}"),))

    async def _messages(self) -> AsyncIterator[agent_pb2.AgentMessage]:
        while (message := await self.outgoing.get()) is not None:
            yield message

    def send(self, **body: object) -> int:
        message_id = next(self.ids)
        self.outgoing.put_nowait(agent_pb2.AgentMessage(id=message_id, **body))  # type: ignore[arg-type]
        return message_id

    async def receive(self, kind: str) -> agent_pb2.ServerMessage:
        """The next server message of this kind (acks and others in between are skipped)."""
        while True:
            message = await asyncio.wait_for(self.call.read(), 10)
            assert message is not grpc.aio.EOF, "the server closed the stream"
            if message.WhichOneof("body") == kind:
                return message

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        await self.channel.close()


def hello(machine: str = "gpu-07", gpus: int = 2) -> agent_pb2.Hello:
    return agent_pb2.Hello(
        machine=machine,
        cpu_cores=32,
        memory_bytes=256 * 2**30,
        gpus=[
            agent_pb2.Gpu(
                index=i,
                uuid=f"SIM-{i}",
                model="Simulated GPU",
                memory_bytes=80 * 2**30,
                healthy=True,
            )
            for i in range(gpus)
        ],
        agent_version="test",
        protocol=2,
    )


async def test_a_machine_joins_receives_its_commands_and_reports_its_workers(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    agent = Agent(endpoint, machine_token)
    try:
        agent.send(hello=hello())
        welcome = await agent.receive("welcome")
        assert welcome.welcome.lease_seconds == 60
        async with db.read() as session:
            machine = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
            gpus = list(await session.scalars(select(Gpu).order_by(Gpu.index)))
        assert machine is not None and machine.state == "ready"
        assert [(g.index, g.model) for g in gpus] == [(0, "Simulated GPU"), (1, "Simulated GPU")]

        world = World(db, clock, tenancy)
        await world.submit(workers=1, gpus=2)
        await world.schedule()
        start = await agent.receive("command")
        assert start.command.kind == agent_pb2.COMMAND_KIND_START
        worker = (await world.workers("llama-sft"))[0]
        assert start.command.worker_id == worker.id  # the machine knows it by id alone
        assert start.command.start.worker == "llama-sft-0"  # its name, for people
        assert start.command.start.attempt == 1
        assert start.command.start.astraeus_environment["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert list(start.command.start.command) == ["python", "train.py"]

        agent.send(command_ack=agent_pb2.CommandAck(command_ids=[start.command.command_id]))
        for state in (agent_pb2.WORKER_STATE_READY, agent_pb2.WORKER_STATE_RUNNING):
            agent.send(
                worker_event=agent_pb2.WorkerEvent(worker_id=worker.id, attempt=1, state=state)
            )
        release = await agent.receive("command")
        assert release.command.kind == agent_pb2.COMMAND_KIND_RELEASE
        assert release.command.worker_id == worker.id
        last = agent.send(
            worker_event=agent_pb2.WorkerEvent(
                worker_id=worker.id,
                attempt=1,
                state=agent_pb2.WORKER_STATE_EXITED,
                exit_code=0,
                reason="Exited with code 0",
            )
        )
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        assert await world.status("llama-sft") == ("Completed", "1 of 1 workers completed")
        async with db.read() as session:
            acked = await session.scalar(
                select(AgentCommand.acked_at).where(AgentCommand.id == start.command.command_id)
            )
        assert acked == clock.now()
    finally:
        await agent.close()


async def test_a_failure_snapshot_reaches_the_worker(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    agent = Agent(endpoint, machine_token)
    try:
        agent.send(hello=hello())
        await agent.receive("welcome")
        world = World(db, clock, tenancy)
        await world.submit(workers=1, gpus=1, restart_policy="never")
        await world.schedule()
        start = await agent.receive("command")
        tail = "".join(f"line {i}\n" for i in range(50))
        last = agent.send(
            worker_event=agent_pb2.WorkerEvent(
                worker_id=start.command.worker_id,
                attempt=1,
                state=agent_pb2.WORKER_STATE_EXITED,
                exit_code=137,
                reason="OOMKilled: the container exceeded its memory limit",
                log_tail=tail,
            )
        )
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        worker = (await world.workers("llama-sft"))[0]
        assert worker.last_failure == {
            "reason": "OOMKilled: the container exceeded its memory limit",
            "failed_at": "2026-10-01T01:02:11.402117+00:00",
            "exit_code": 137,
            "log_tail": tail,
        }
    finally:
        await agent.close()


async def test_a_wrong_token_or_no_hello_is_refused(
    endpoint: str, machine_token: str, tenancy: Tenancy
) -> None:
    for token in ("astx_" + "z" * 40, tenancy.member_token):
        agent = Agent(endpoint, token)
        agent.send(hello=hello())
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await agent.receive("welcome")
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert caught.value.details() == "The machine token is unknown or revoked."
        await agent.close()
    agent = Agent(endpoint, machine_token)
    agent.send(heartbeat=agent_pb2.Heartbeat())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.receive("welcome")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await agent.close()


async def test_an_agent_of_the_protocol_that_named_workers_is_refused(
    endpoint: str, machine_token: str, db: Database
) -> None:
    # issue 17: an older agent would name workers by name, which repeat across workspaces
    agent = Agent(endpoint, machine_token)
    old = hello()
    old.ClearField("protocol")
    agent.send(hello=old)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.receive("welcome")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == (
        "This agent speaks an older protocol, which names workers by name: upgrade it to the "
        "server's version."
    )
    await agent.close()
    async with db.read() as session:
        assert await session.scalar(select(Machine).where(Machine.name == "gpu-07")) is None


def test_a_full_follow_buffer_counts_every_line_it_drops() -> None:
    from backend.agents.stream import FOLLOW_BUFFER, Follow

    follow = Follow()
    for i in range(FOLLOW_BUFFER):
        follow.offer(agent_pb2.LogChunk(worker_id=7, text=f"line {i}\n"))
    follow.offer(agent_pb2.LogChunk(worker_id=7, text="x\ny\n"))  # no room: 2 lines missed
    follow.offer(agent_pb2.LogChunk(worker_id=7, text="z\n", ended=True))
    chunks = []
    while not follow.chunks.empty():
        chunks.append(follow.chunks.get_nowait())
    assert chunks[-1].ended
    kept = sum(c.text.count("\n") for c in chunks)
    # Every line is either delivered or counted as missed: FOLLOW_BUFFER + 2 + 1 in all.
    assert kept + chunks[-1].missed_lines == FOLLOW_BUFFER + 3
