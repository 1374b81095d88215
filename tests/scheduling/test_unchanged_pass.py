"""A pass with nothing new (issue 24): on PostgreSQL it reads one digest of its inputs and
stops, where a pass in this process that changed nothing saw the same inputs less than a
minute before; anything a pass decides from changes the digest, and a pass during which
anything was committed is not remembered. On SQLite every pass plans. The answers are the same
either way."""

from __future__ import annotations

from typing import Any

import pytest

from backend.db import Database
from backend.scheduling import repository
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy, row_counts


@pytest.fixture
async def world(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    return world


def skips(db: Database) -> bool:
    return db.engine.dialect.name == "postgresql"


async def settled(world: World) -> None:
    """Two passes: one that places and writes reasons, one that plans again and writes
    nothing (its own writes were its inputs' change)."""
    await world.schedule()
    assert (await world.schedule()).planned


async def test_a_pass_with_nothing_new_decides_nothing_and_says_the_same(
    world: World, db: Database
) -> None:
    await world.submit(name="first", workers=1, gpus=8)
    await world.submit(name="second", workers=1, gpus=8)
    placing = await world.schedule()
    assert (placing.placed, placing.planned) == (["first"], True)
    assert placing.reasons["second"].startswith("No machine fits")
    before = await row_counts(db)
    again = await world.schedule()
    assert (again.placed, again.planned, again.reasons) == ([], True, placing.reasons)
    still = await world.schedule()
    assert still.planned is not skips(db)
    assert (still.placed, still.preempted, still.reasons) == ([], [], placing.reasons)
    assert await row_counts(db) == before


async def test_a_new_machine_and_a_new_run_each_make_it_plan(world: World, db: Database) -> None:
    await world.submit(name="first", workers=1, gpus=8)
    await world.submit(name="second", workers=1, gpus=8)
    await settled(world)
    await world.machine("gpu-08")
    joined = await world.schedule()
    assert (joined.placed, joined.planned) == (["second"], True)
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
    assert (await world.schedule()).placed == []  # backing off: nothing to write
    assert (await world.schedule()).planned is not skips(db)  # still backing off
    world.clock.moment = run.restart_at
    world.clock.advance(seconds=1)
    restarted = await world.schedule()
    assert (restarted.placed, restarted.planned) == (["llama-sft"], True)


async def test_a_run_submitted_while_a_pass_reads_is_placed_by_the_next(
    world: World, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass reads its pending runs, then the run is committed (another session, the real
    submission), then the pass ends having changed nothing: the digest after it has the run,
    the one before it had not; it is not remembered, and the next pass places the run."""
    if not skips(db):
        pytest.skip("SQLite's one writer: the submission would wait for the pass")
    await world.submit(name="first", workers=1, gpus=8)
    await settled(world)
    read = repository.pending_runs

    async def then_submit(*args: Any, **kwargs: Any) -> Any:
        rows = await read(*args, **kwargs)
        monkeypatch.setattr(repository, "pending_runs", read)
        await world.submit(name="late", workers=1, gpus=4)
        return rows

    await world.machine("gpu-08")  # something new: the pass plans
    monkeypatch.setattr(repository, "pending_runs", then_submit)
    during = await world.schedule()
    assert during.planned and "late" not in during.reasons and during.placed == []
    after = await world.schedule()
    assert (after.placed, after.planned) == (["late"], True)


async def test_a_remembered_pass_is_planned_again_after_a_minute(
    world: World, db: Database
) -> None:
    await world.submit(name="first", workers=1, gpus=8)
    await settled(world)
    world.clock.advance(seconds=30)
    assert (await world.schedule()).planned is not skips(db)
    world.clock.advance(seconds=31)
    assert (await world.schedule()).planned
