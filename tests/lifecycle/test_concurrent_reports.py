"""Reports from different machines about one run, committed at the same time, see each other:
the run's row is locked on PostgreSQL and write transactions are taken whole on SQLite."""

from __future__ import annotations

import asyncio

import pytest

from tests.lifecycle.world import World


@pytest.mark.parametrize("attempt", range(3))
async def test_the_last_of_a_gang_to_get_ready_releases_it(world: World, attempt: int) -> None:
    # seed L-45 (Starting together: n of 2 ready): both ready at once, from two machines;
    # neither may think the other is still preparing, or the gang waits at its barrier for ever.
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(name="llama-sft", workers=2, gpus=8)
    await world.schedule()
    await asyncio.gather(world.report("llama-sft-0", "ready"), world.report("llama-sft-1", "ready"))
    assert ("release", "llama-sft-0") in await world.commands("gpu-07")
    assert ("release", "llama-sft-1") in await world.commands("gpu-08")
    assert await world.status("llama-sft") == ("Starting", "Starting together: 2 of 2 ready")
