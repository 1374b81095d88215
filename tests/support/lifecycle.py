"""Runs brought to a state for the tests that need one."""

from __future__ import annotations

import pytest

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy


async def running_gang(world: World, **spec: object) -> None:
    """llama-sft: 2 workers of 8 GPUs on gpu-07 and gpu-08, placed at +1s, running at +2s."""
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(**({"gpus": 8} | spec))
    world.clock.advance(seconds=1)
    await world.schedule()
    world.clock.advance(seconds=1)
    count = int(spec.get("workers", 2))  # type: ignore[call-overload]
    await world.start(*(f"llama-sft-{rank}" for rank in range(count)))


@pytest.fixture
async def placed(db: Database, clock: FakeClock, tenancy: Tenancy) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=1)
    await world.schedule()
