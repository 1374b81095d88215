"""The scheduling pass as a Dramatiq actor, through the real Redis broker and a real worker."""

from __future__ import annotations

import asyncio

from dramatiq.brokers.redis import RedisBroker
from sqlalchemy import func, select

from backend.db import Database
from backend.jobs import broker as job_broker
from backend.models import AgentCommand, Worker
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy


async def _join(broker: RedisBroker) -> None:
    for queue in job_broker.QUEUES:
        await asyncio.to_thread(broker.join, queue, timeout=30_000)


async def test_a_pass_through_redis_places_a_submitted_run(
    redis_worker: RedisBroker, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(workers=2, gpus=4)
    job_broker.nudge_scheduler()
    await _join(redis_worker)
    workers = await world.workers("llama-sft")
    assert [(w.state, w.reason) for w in workers] == [
        ("Starting", "Placed on gpu-07; starting"),
        ("Starting", "Placed on gpu-07; starting"),
    ]


async def test_passes_running_at_once_never_give_a_gpu_twice(
    redis_worker: RedisBroker, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=4)
    for i in range(6):
        await world.submit(name=f"r{i}", workers=1, gpus=1)
    for _ in range(8):
        job_broker.nudge_scheduler()
    await _join(redis_worker)
    async with db.read() as session:
        placed = list(await session.scalars(select(Worker).where(Worker.machine_id.is_not(None))))
        starts = await session.scalar(
            select(func.count()).select_from(AgentCommand).where(AgentCommand.kind == "start")
        )
    held = [g for w in placed for g in w.gpu_ids]
    assert sorted(held) == [0, 1, 2, 3]
    assert starts == 4
