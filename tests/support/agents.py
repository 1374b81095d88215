"""The real agent (agent/connection.py) in this process against the stream's server side."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from agent.config import AgentConfig
from agent.connection import Agent
from agent.gpus import simulated
from backend.agents.servicer import AgentService, serve
from backend.db import Database
from backend.models import Worker
from tests.support import FakeClock
from tests.support.stream import _port


@contextlib.asynccontextmanager
async def agent_endpoint(
    db: Database, clock: FakeClock, lease: timedelta = timedelta(seconds=60)
) -> AsyncIterator[tuple[AgentService, str]]:
    """The agents' gRPC endpoint on a port of its own, and the service behind it."""
    service = AgentService(db, clock, lease=lease, poll_interval=0.05)
    address = f"127.0.0.1:{_port()}"
    server = await serve(service, address)
    try:
        yield service, address
    finally:
        await stop_serving(server, service)


async def stop_serving(server: Any, service: AgentService) -> None:
    """The endpoint stopped, and the streams' last steps (the lease keeper's final renewal),
    which run after the server's stop returns, done: before the test's database is emptied or
    removed, so that none writes to it after, or holds SQLite's write lock meanwhile."""
    await server.stop(grace=0)
    for _ in range(300):
        if service.idle:
            break
        await asyncio.sleep(0.05)


@pytest.fixture
async def service(db: Database, clock: FakeClock) -> AsyncIterator[tuple[AgentService, str]]:
    async with agent_endpoint(db, clock) as endpoint:
        yield endpoint


def agent_for(address: str, token: str, data_dir: Path) -> Agent:
    return Agent(
        AgentConfig(
            server=address,
            token=token,
            machine="gpu-07",
            data_dir=data_dir,
            gpus=simulated(2, "gpu-07"),
            cpu_cores=8,
            memory_bytes=64 * 2**30,
            heartbeat_seconds=1,
            sample_seconds=0.2,
        )
    )


async def wait_for(what: str, check: object, seconds: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"waited for {what}"
        await asyncio.sleep(0.05)


async def worker_state(db: Database, name: str) -> str:
    async with db.read() as session:
        row = await session.scalar(select(Worker).where(Worker.name == name))
    return row.state if row is not None else ""
