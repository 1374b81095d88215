"""Reports from different machines about one run, committed at the same time, see each other:
the run's row is locked on PostgreSQL and write transactions are taken whole on SQLite."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backend.accounting import counting
from backend.lifecycle import repository
from backend.runs import service as runs
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


async def test_a_report_that_races_its_runs_deletion_changes_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report reads its worker, then the run is deleted and committed (another session, the
    real deletion), then the report takes the run's lock: the worker is gone from the gang. It
    changes nothing (before: a KeyError, which failed the machine's whole stream, seen in CI
    as a follow that never ended)."""
    if world.db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's one writer: the deletion would wait for the report")
    await world.machine("gpu-07")
    await world.submit(name="llama-sft", workers=1, gpus=8)
    await world.schedule()
    await world.start("llama-sft-0")
    read = repository.placed_worker

    async def then_delete(*args: Any, **kwargs: Any) -> Any:
        found = await read(*args, **kwargs)
        monkeypatch.setattr(repository, "placed_worker", read)
        principal = await world.principal()
        async with world.db.transaction() as session:
            await runs.delete_run(session, world.clock, principal, "llama-sft", ledger=counting)
        return found

    monkeypatch.setattr(repository, "placed_worker", then_delete)
    await world.report("llama-sft-0", "progress", step=10)
    assert (await world.run("llama-sft")).state == "Deleted"
