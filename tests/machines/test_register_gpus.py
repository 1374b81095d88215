"""A machine's GPUs as its agent lists them at each Hello."""

from __future__ import annotations

from sqlalchemy import select

from backend.models import Gpu
from tests.lifecycle.world import World


async def test_a_machine_registered_again_keeps_the_gpus_its_agent_lists(world: World) -> None:
    machine_id = await world.machine("gpu-07", gpus=4)
    assert await world.machine("gpu-07", gpus=2) == machine_id
    async with world.db.read() as session:
        found = await session.execute(
            select(Gpu.index, Gpu.uuid, Gpu.health)
            .where(Gpu.machine_id == machine_id)
            .order_by(Gpu.index)
        )
    assert [tuple(g) for g in found] == [(0, "GPU-gpu-07-0", "ok"), (1, "GPU-gpu-07-1", "ok")]
