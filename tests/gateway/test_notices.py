"""Other processes' commits reach a replica's streams through PostgreSQL's notices (issue 40):
in production the scheduler and the jobs write the machines' commands in processes of their
own, and an admin revokes a credential through any replica; the replica holding the stream
heard of them at its next poll, two queries a second whatever the load. Now the committing
transaction announces them (backend/db/commit_signals.py) and the replica listens
(backend/db/notices.py): a replica polling once a minute sends the commands and closes the
revoked stream within a second or two. The writer here is a real second process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from astraeus.agent.v1 import agent_pb2

from backend.db import Database
from backend.db.commit_signals import on_rows_committed
from backend.db.notices import Notices, libpq_url
from backend.gateway.servicer import AgentService, serve
from tests.gateway.test_many_streams import connected, credentials
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.stream import _port

ROOT = Path(__file__).resolve().parents[2]

# What the other process does: the scheduler's pass, an admin's revocation, a command added
# in a transaction rolled back; through the services, as the jobs' processes do.
ANOTHER_PROCESS = r"""
import asyncio, sys

from backend.clock import SystemClock
from backend.db import Database
from backend.machine_identity import service as identity
from backend.models import AgentCommand, Machine
from backend.scheduling import service as scheduling
from sqlalchemy import select
from tests.support import local_cluster


async def main(url: str, what: str) -> None:
    db = Database.from_url(url, pool_size=1)
    try:
        async with db.transaction() as session:
            if what == "schedule":
                await scheduling.schedule_all(session, SystemClock())
            elif what == "revoke":
                cluster = await session.scalar(local_cluster())
                await identity.revoke_credential(session, SystemClock(), cluster, "gpu-01")
            elif what == "rolled back":
                machine = await session.scalar(select(Machine).where(Machine.name == "gpu-00"))
                at = SystemClock().now()
                command = {"worker_name": "x", "kind": "stop", "payload": {}, "created_at": at}
                session.add(AgentCommand(machine_id=machine.id, **command))
                await session.flush()
                raise SystemExit(0)
    finally:
        await db.dispose()


asyncio.run(main(*sys.argv[1:]))
"""


def another_process(database_url: str, what: str) -> None:
    subprocess.run(
        [sys.executable, "-c", ANOTHER_PROCESS, database_url, what], cwd=ROOT, check=True
    )


@pytest.fixture
def postgresql(database_url: str) -> str:
    if libpq_url(database_url) is None:
        pytest.skip("SQLite has no notices: its writers share the server's process")
    return database_url


async def test_a_commit_of_another_process_is_heard_and_a_rollback_is_not(
    postgresql: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-00")
    heard: list[float] = []
    news = asyncio.Event()

    def hear() -> None:
        heard.append(time.monotonic())
        news.set()

    forget = on_rows_committed("agent_commands", hear)
    try:
        async with Notices(postgresql).listening() as notices:
            async with asyncio.timeout(10):
                await notices.wait_connected()
            assert len(heard) == 1  # as it connects: what came while no one listened
            await asyncio.to_thread(another_process, postgresql, "rolled back")
            await asyncio.sleep(1)
            assert len(heard) == 1

            await world.submit(name="noticed", workers=1, gpus=2)
            heard.clear()
            news.clear()
            began = time.monotonic()
            await asyncio.to_thread(another_process, postgresql, "schedule")
            async with asyncio.timeout(5):
                await news.wait()
            assert heard[0] >= began
    finally:
        forget()


async def test_a_replica_polling_once_a_minute_hears_another_process_at_once(
    postgresql: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    notices = Notices(postgresql)
    service = AgentService(
        db, clock, lease=timedelta(seconds=60), poll_interval=60, notices=notices
    )
    address = f"127.0.0.1:{_port()}"
    async with notices.listening():
        server = await serve(service, address)
        agents = await connected(address, await credentials(db, clock, ["gpu-00", "gpu-01"]))
        try:
            async with asyncio.timeout(10):
                await notices.wait_connected()
            await asyncio.sleep(0.2)  # its first look, as the streams opened, is done
            world = World(db, clock, tenancy)
            await world.submit(name="noticed", workers=2, gpus=2)
            began = time.monotonic()
            await asyncio.to_thread(another_process, postgresql, "schedule")
            starts = await asyncio.gather(*(a.receive("command") for a in agents.values()))
            assert time.monotonic() - began < 10  # the process's start and a notice: not 60 s
            assert sorted(s.command.start.worker for s in starts) == ["noticed-0", "noticed-1"]

            began = time.monotonic()
            await asyncio.to_thread(another_process, postgresql, "revoke")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await agents["gpu-01"].receive("never")
            assert time.monotonic() - began < 10  # not the 30 s net of the checks
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            sent = agents["gpu-00"].send(heartbeat=agent_pb2.Heartbeat())  # the other goes on
            while (await agents["gpu-00"].receive("ack")).ack.up_to < sent:
                pass
        finally:
            for a in agents.values():
                await a.close()
            service.close_streams()
            await server.stop(grace=1)
