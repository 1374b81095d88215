"""The agent stream's tests' own client: a bare stream, a machine's token, a free port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc
from sqlalchemy import event

from backend.db import Database
from backend.machine_identity import service as identity
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy, free_port, local_cluster


def _port() -> int:
    """A port for a test's agent endpoint: this lane's own, below the kernel's range for
    outgoing connections (one handed out from that range as free can be taken by a connection
    before the endpoint binds it, as a Slurm daemon's was in the CI)."""
    return free_port()


@pytest.fixture
async def machine_token(db: Database, clock: FakeClock, tenancy: Tenancy) -> str:
    """Machine gpu-07's own credential, as its agent gets it for a join token."""
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        joining = await identity.issue_join_token(
            session, clock, organization_id=cluster.organization_id, cluster_id=cluster.id
        )
        credential = await identity.join(session, clock, joining.secret, "gpu-07")
    return credential.secret


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


async def one_worker_started(agent: Agent, world: World) -> agent_pb2.ServerMessage:
    """The agent welcomed, and a run of one worker (never restarted) placed on its machine:
    the worker's start, as the agent receives it."""
    agent.send(hello=hello())
    await agent.receive("welcome")
    await world.submit(workers=1, gpus=1, restart_policy="never")
    await world.schedule()
    return await agent.receive("command")


async def running_from(agent: Agent, start: agent_pb2.ServerMessage) -> int:
    """The worker of a start command acknowledged, ready and running, as its agent says; its
    id, once its gang's release has come."""
    worker_id = start.command.worker_id
    agent.send(command_ack=agent_pb2.CommandAck(command_ids=[start.command.command_id]))
    for state in (agent_pb2.WORKER_STATE_READY, agent_pb2.WORKER_STATE_RUNNING):
        agent.send(worker_event=agent_pb2.WorkerEvent(worker_id=worker_id, attempt=1, state=state))
    await agent.receive("command")  # the release
    return int(worker_id)


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
        protocol=3,
    )


@contextlib.contextmanager
def statements(db: Database) -> Iterator[list[str]]:
    """The SQL statements the database is sent meanwhile."""
    seen: list[str] = []

    def heard(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    engine = db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", heard)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", heard)
