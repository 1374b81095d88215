"""A pass with nothing new (issue 24): on PostgreSQL it reads one digest of its inputs and
stops, where the last pass in this process saw the same inputs; anything a pass decides from
changes the digest. On SQLite every pass plans. The answers are the same either way."""

from __future__ import annotations

import pytest

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy, row_counts


@pytest.fixture
async def world(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    return world


def skips(db: Database) -> bool:
    return db.engine.dialect.name == "postgresql"


async def test_a_second_pass_with_nothing_new_decides_nothing_and_says_the_same(
    world: World, db: Database
) -> None:
    await world.submit(name="first", workers=1, gpus=8)
    await world.submit(name="second", workers=1, gpus=8)
    placing = await world.schedule()
    assert (placing.placed, placing.planned) == (["first"], True)
    before = await row_counts(db)
    again = await world.schedule()
    assert again.planned is not skips(db)
    assert again.placed == [] and again.preempted == []
    assert again.reasons == placing.reasons
    assert placing.reasons["second"].startswith("No machine fits")
    assert await row_counts(db) == before


async def test_a_new_machine_and_a_new_run_each_make_it_plan(world: World, db: Database) -> None:
    await world.submit(name="first", workers=1, gpus=8)
    await world.submit(name="second", workers=1, gpus=8)
    await world.schedule()
    await world.schedule()  # settled
    await world.machine("gpu-08")
    joined = await world.schedule()
    assert (joined.placed, joined.planned) == (["second"], True)
    assert (await world.schedule()).planned is not skips(db)
    await world.submit(name="third", workers=1, gpus=4)
    queued = await world.schedule()
    assert queued.planned and "third" in queued.reasons


async def test_a_restarts_backoff_ending_is_new_though_no_row_changed(
    world: World, db: Database
) -> None:
    await world.submit(name="llama-sft", workers=1, gpus=8, max_restarts=3)
    await world.schedule()
    await world.start("llama-sft-0")
    await world.report("llama-sft-0", "exited", exit_code=1)
    run = await world.run("llama-sft")
    assert run.state == "Pending" and run.restart_at is not None
    waiting = await world.schedule()
    assert waiting.placed == []
    assert (await world.schedule()).planned is not skips(db)  # still backing off
    world.clock.moment = run.restart_at
    world.clock.advance(seconds=1)
    restarted = await world.schedule()
    assert (restarted.placed, restarted.planned) == (["llama-sft"], True)
