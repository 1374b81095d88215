"""The real agent (agent/connection.py) against the real server side, in one event loop:
log tails and follows of a real process, its samples, and a restart of the agent."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from sqlalchemy import select

from backend.db import Database
from backend.gateway.follow_buffer import LogChunkInfo
from backend.gateway.servicer import AgentService
from backend.models import AgentCommand
from tests.lifecycle.world import World
from tests.support import WORKLOAD_PYTHON, FakeClock, Tenancy
from tests.support.agents import agent_for, running_worker, wait_for, worker_state

PRINTS = (
    "import time\nfor i in range(20):\n    print(f'line {i}', flush=True)\n    time.sleep(0.1)\n"
)


async def test_following_a_real_workers_log_streams_its_lines_until_it_ends(
    service: tuple[AgentService, str],
    machine_token: str,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    tmp_path: Path,
) -> None:
    svc, address = service
    command = [WORKLOAD_PYTHON, "-c", PRINTS]
    async with running_worker(
        svc, address, machine_token, db, clock, tenancy, tmp_path, command
    ) as (machine_id, worker):
        chunks: list[LogChunkInfo] = [
            c async for c in svc.follow(machine_id, worker, tail_lines=1000)
        ]
        assert chunks[-1].ended
        lines = "".join(c.text for c in chunks).splitlines()
        assert lines == [f"line {i}" for i in range(20)]
        assert len(chunks) > 2  # they came as they were written, not all at the end
        assert not svc.streams.by_machine[machine_id].follows  # nothing left behind

        async def ended() -> bool:
            return await worker_state(db, "llama-sft-0") == "Completed"

        await wait_for("completed", ended)
        tail = await svc.tail(machine_id, worker, 5, 900 * 1024, wait_s=5)
        assert tail is not None and tail.archived
        assert tail.text.splitlines() == [f"line {i}" for i in range(15, 20)]


async def test_a_start_command_over_the_stream_limit_fails_its_worker_and_the_agent_goes_on(
    service: tuple[AgentService, str],
    machine_token: str,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    tmp_path: Path,
) -> None:
    """Before issue 18 the agent's channel refused the message (over gRPC's 4 MiB), the agent
    connected again and was sent it again, forever: no command reached the machine any more."""
    _, address = service
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=2)
    await world.submit(name="huge", workers=1, gpus=1, command=[WORKLOAD_PYTHON, "-c", "1"])
    await world.schedule()
    async with db.transaction() as session:  # as large as a spec could once make it
        start = await session.scalar(select(AgentCommand).where(AgentCommand.kind == "start"))
        assert start is not None
        start.payload = {**start.payload, "environment": {"BIG": "x" * (5 * 2**20)}}
    await world.submit(name="small", workers=1, gpus=1, command=[WORKLOAD_PYTHON, "-c", "1"])
    await world.schedule()
    running = asyncio.create_task(agent_for(address, machine_token, tmp_path).run_forever())
    try:

        async def small_done() -> bool:
            return await worker_state(db, "small-0") == "Completed"

        await wait_for("the next run's worker completed", small_done)
        (huge,) = await world.workers("huge")
        assert huge.last_failure is not None
        assert huge.last_failure["reason"] == (
            "Its start command is 5.0 MiB, over the 3.9 MiB a machine's stream carries: make "
            "the spec's environment, command and mounts smaller."
        )
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
