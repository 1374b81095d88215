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
from agent.identity import WorkloadUsers
from backend.clock import Clock
from backend.db import Database
from backend.gateway.servicer import AgentService, serve
from backend.logs.service import WorkerRef
from backend.models import Machine, Worker
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.sandboxed import process_uids
from tests.support.stream import _port


def unconnected_agent(data_dir: Path, **config: Any) -> Agent:
    """The real agent of machine gpu-07 (one simulated GPU, 8 cores, 1 GiB), never connected:
    what it would send waits in its queue, for a test to read."""
    settings: dict[str, Any] = {
        "server": "127.0.0.1:1",
        "token": "unused",
        "machine": "gpu-07",
        "data_dir": data_dir,
        "gpus": simulated(1, "gpu-07"),
        "cpu_cores": 8,
        "memory_bytes": 2**30,
        "users": WorkloadUsers(uids=process_uids()),
    }
    return Agent(AgentConfig(**(settings | config)))


@contextlib.asynccontextmanager
async def agent_endpoint(
    db: Database, clock: Clock, lease: timedelta = timedelta(seconds=60)
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


def agent_for(address: str, token: str, data_dir: Path, **config: Any) -> Agent:
    """The real agent of machine gpu-07 (two simulated GPUs, 8 cores, 64 GiB), sampling five
    times a second; ``config`` changes its settings."""
    settings: dict[str, Any] = {
        "server": address,
        "token": token,
        "machine": "gpu-07",
        "data_dir": data_dir,
        "gpus": simulated(2, "gpu-07"),
        "cpu_cores": 8,
        "memory_bytes": 64 * 2**30,
        "heartbeat_seconds": 1,
        "sample_seconds": 0.2,
        "users": WorkloadUsers(uids=process_uids()),
    }
    return Agent(AgentConfig(**(settings | config)))


async def wait_for(what: str, check: object, seconds: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"waited for {what}"
        await asyncio.sleep(0.05)


async def worker_state(db: Database, name: str) -> str:
    async with db.read() as session:
        row = await session.scalar(select(Worker).where(Worker.name == name))
    return row.state if row is not None else ""


@contextlib.asynccontextmanager
async def running_worker(
    svc: AgentService,
    address: str,
    machine_token: str,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    data_dir: Path,
    command: list[str],
) -> AsyncIterator[tuple[int, WorkerRef]]:
    """The real agent in this event loop, joined as gpu-07, running one run of one worker
    (llama-sft-0) of ``command``: the machine's id and the worker, once it runs. The agent
    stops at the end."""
    agent = agent_for(address, machine_token, data_dir)
    running = asyncio.create_task(agent.run_forever())
    try:

        async def joined() -> bool:
            return bool(svc.streams.by_machine)

        await wait_for("the machine", joined)
        world = World(db, clock, tenancy)
        await world.submit(workers=1, gpus=1, command=command)
        await world.schedule()

        async def running_now() -> bool:
            return await worker_state(db, "llama-sft-0") == "Running"

        await wait_for("running", running_now)
        async with db.read() as session:
            machine = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
            row = await session.scalar(select(Worker).where(Worker.name == "llama-sft-0"))
        assert machine is not None and row is not None
        yield machine.id, WorkerRef(row.id, row.name)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
