"""A real agent's Hello reaches the real server: the machine keeps how its agent runs workers and
what it cannot measure per worker; a Hello naming an executor the server does not know is
refused, naming the field (issue 20)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from agent.metrics import NETWORK_METRICS
from backend.db import Database
from backend.gateway.servicer import AgentService
from backend.models import Machine
from tests.support.agents import agent_for, wait_for


async def test_the_machine_keeps_its_agents_executor_and_unmeasured_metrics(
    service: tuple[AgentService, str],
    machine_token: str,
    db: Database,
    tmp_path: Path,
) -> None:
    _, address = service
    agent = agent_for(
        address, machine_token, tmp_path, executor="docker", docker_socket=str(tmp_path / "none")
    )
    running = asyncio.create_task(agent.run_forever())
    try:

        async def registered() -> bool:
            async with db.read() as session:
                row = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
            return row is not None and row.executor is not None

        await wait_for("the machine", registered)
        async with db.read() as session:
            row = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
        assert row is not None
        # Containers run on the host's network too: no per-worker network bytes.
        assert (row.executor, row.unmeasured_metrics) == ("docker", list(NETWORK_METRICS))
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_a_hello_naming_an_unknown_executor_is_refused(
    service: tuple[AgentService, str],
    machine_token: str,
    db: Database,
    tmp_path: Path,
) -> None:
    _, address = service
    agent = agent_for(address, machine_token, tmp_path, executor="podman")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await asyncio.wait_for(agent._session(), 20)  # run_forever stops on it, saying this
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        "Hello refused: executor must be one of process, docker, slurm (got 'podman')."
    )
    async with db.read() as session:
        assert await session.scalar(select(Machine).where(Machine.name == "gpu-07")) is None
