"""The goodput tick on SQLite and PostgreSQL: what it writes equals the pure computation over
the recorded history, however the ticks come (DESIGN §4)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import datetime, timedelta

import pytest
from sqlalchemy import delete, select

from backend.accounting import (
    counting,
    ledger_queries,
    ledger_writes,
    reports,
    repository,
    retention,
    run_goodput,
)
from backend.accounting.rules import Category, Period
from backend.accounting.viewers import Viewer
from backend.lifecycle import service as lifecycle
from backend.models import GoodputHour, GoodputRunTotal, Run, StateTransition, Worker
from tests.accounting.totals import assert_run_totals_match_the_hours
from tests.lifecycle.world import World
from tests.support.accounting import (
    T0,
    a_busy_and_an_idle_rank,
    all_intervals,
    expected,
    ledger,
    sample,
    tick,
)


async def run_id_of(world: World, name: str) -> int:
    async with world.db.read() as session:
        found = await session.scalar(select(Run.id).where(Run.name == name))
    assert found is not None
    return found


@pytest.mark.parametrize("tick_every", [60, 17, 600, None])
async def test_the_ledgers_equal_the_pure_computation_however_often_the_tick_runs(
    world: World, tick_every: int | None
) -> None:
    # DESIGN §4 invariants 1 and 2; seed G-1: each worker, each tick, in one category
    # seed G-2 (weighted by its GPUs), G-3 (productive: GPUs busy, 5% or more), G-5 (idle)
    await a_busy_and_an_idle_rank(world)
    elapsed = 0
    for _ in range(60):  # ten minutes in steps of 10 s, sampled each step
        world.clock.advance(seconds=10)
        elapsed += 10
        await sample(world, {0: 0.9, 1: 0.01})
        if tick_every is not None and elapsed % tick_every < 10:
            await tick(world)
    async with world.db.transaction() as session:
        await lifecycle.stop_run(session, world.clock, await world.run("llama-sft"), "alice")
    world.clock.advance(seconds=3)
    for rank in (0, 1):
        await world.report(f"llama-sft-{rank}", "exited", exit_code=143)
    world.clock.advance(minutes=2)
    await tick(world)
    until = counting.minute_floor(world.clock.now())
    got = await ledger(world)
    assert got == await expected(world, until)
    # Conservation: two workers of 8 GPUs from submission to their end, every second.
    async with world.db.read() as session:
        ends = list(
            await session.scalars(
                select(StateTransition.transition_at).where(StateTransition.phase == "ended")
            )
        )
    assert len(ends) == 2
    assert sum(got.values()) == pytest.approx(sum(8 * (e - T0).total_seconds() for e in ends))
    assert got[(Category.PRODUCTIVE.value, True)] > 0 and got[(Category.IDLE.value, True)] > 0
    assert got[(Category.WAITING.value, False)] == pytest.approx(2 * 8 * 37)
    # Every scope of the ledgers adds up to the same time.
    assert sum((await ledger(world, "workspace")).values()) == pytest.approx(sum(got.values()))
    assert sum((await ledger(world, "machine")).values()) == pytest.approx(
        sum(v for (_, held), v in got.items() if held)
    )


async def test_a_tick_run_twice_or_late_counts_nothing_twice(world: World) -> None:
    await a_busy_and_an_idle_rank(world)
    world.clock.advance(minutes=3)
    first = await tick(world)
    again = await tick(world)  # a retried or duplicated tick: nothing new to count
    assert first.intervals > 0 and again.intervals == 0
    before = await ledger(world)
    world.clock.advance(hours=1, minutes=7)  # the server was down for an hour
    await tick(world)
    until = counting.minute_floor(world.clock.now())
    assert await ledger(world) == await expected(world, until)
    assert sum((await ledger(world)).values()) > sum(before.values())


@pytest.mark.parametrize("ticked", [True, False])
async def test_a_run_deleted_between_ticks_is_counted_to_its_deletion(
    world: World, ticked: bool
) -> None:
    # DESIGN §4 conservation: a run deleted while it runs (its workers, their history and
    # their open intervals go with it) is counted to the second it was deleted, not to the
    # tick before, and nothing after
    await a_busy_and_an_idle_rank(world)
    world.clock.advance(minutes=2, seconds=50)
    await sample(world, {0: 0.9, 1: 0.01})
    if ticked:
        await tick(world)
    world.clock.advance(seconds=25)
    async with world.db.transaction() as session:
        await lifecycle.delete_run(
            session, world.clock, await world.run("llama-sft"), "alice", ledger=counting
        )
    deleted = world.clock.now()
    world.clock.advance(minutes=3)
    await tick(world)
    await tick(world)
    got = await ledger(world)
    assert sum(got.values()) == pytest.approx(2 * 8 * (deleted - T0).total_seconds())
    assert got[(Category.WAITING.value, False)] == pytest.approx(2 * 8 * 37)
    assert sum((await ledger(world, "workspace")).values()) == pytest.approx(sum(got.values()))
    assert sum((await ledger(world, "machine")).values()) == pytest.approx(
        sum(v for (_, held), v in got.items() if held)
    )
    intervals = await all_intervals(world)
    assert max(i.end_at for i in intervals) == deleted  # none open, none past the deletion
    async with world.db.read() as session:
        assert await repository.open_intervals(session) == {}


async def test_workers_deleted_without_their_time_counted_end_at_the_mark(world: World) -> None:
    # Workers gone without lifecycle.delete_run (their history with them: an orphaned open
    # interval) are counted to the tick's mark and no further, their intervals closed there
    await a_busy_and_an_idle_rank(world)
    world.clock.advance(minutes=2, seconds=50)
    await sample(world, {0: 0.9, 1: 0.01})
    await tick(world)
    mark = counting.minute_floor(world.clock.now())
    async with world.db.transaction() as session:
        await session.execute(delete(Worker).where(Worker.name.like("llama-sft-%")))
    world.clock.advance(minutes=3)
    result = await tick(world)
    assert result.intervals == 2 and await tick(world) == counting.TickResult(
        None, counting.minute_floor(world.clock.now())
    )
    assert sum((await ledger(world)).values()) == pytest.approx(2 * 8 * (mark - T0).total_seconds())
    intervals = await all_intervals(world)
    assert max(i.end_at for i in intervals) == mark
    async with world.db.read() as session:
        assert await repository.open_intervals(session) == {}
        await assert_run_totals_match_the_hours(session)


async def test_a_stall_found_later_moves_time_already_counted_into_stalled(world: World) -> None:
    # DESIGN §4 invariant 3; seed G-6: stalled from when it stopped making progress
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=4, stall_timeout="5m", on_stall="keep")
    await world.schedule()
    await world.start("llama-sft-0")
    world.clock.advance(minutes=1)
    await world.report("llama-sft-0", "progress", step=10)
    results = []
    for _ in range(8):  # ticks every minute while it makes no more progress
        world.clock.advance(minutes=1)
        await sample(world, {0: 0.8})
        results.append(await tick(world))
        await world.timers()  # after five quiet minutes: stalled since its last progress
    # The stall was dated back to its last progress: the next tick counted again from there.
    assert [r.recounted_from for r in results if r.recounted_from] == [T0 + timedelta(minutes=1)]
    until = counting.minute_floor(world.clock.now())
    got = await ledger(world)
    assert got == await expected(world, until)
    assert got[(Category.STALLED.value, True)] >= 4 * 6 * 60  # from its last progress on
    async with world.db.read() as session:
        await assert_run_totals_match_the_hours(session)  # the hours taken back, too
    intervals = await all_intervals(world)
    stalled = [i for i in intervals if i.category == "stalled"]
    assert stalled[0].start_at == T0 + timedelta(minutes=1)
    for a, b in itertools.pairwise(intervals):
        assert a.end_at <= b.start_at  # one worker: no second counted twice


async def test_ledgers_and_intervals_are_kept_400_days(world: World) -> None:
    # seed G-43: hourly counts kept 400 days and pruned
    await a_busy_and_an_idle_rank(world)
    world.clock.advance(hours=2)
    await tick(world)
    before = await ledger(world)
    world.clock.advance(days=399)
    async with world.db.transaction() as session:
        assert await retention.prune(session, world.clock) == (0, 0)
    assert await ledger(world) == before
    world.clock.advance(days=1, hours=3)
    async with world.db.transaction() as session:
        hours, intervals = await retention.prune(session, world.clock)
    assert hours > 0 and intervals > 0
    assert await ledger(world) == {}


async def test_whole_days_read_from_the_daily_cells_equal_the_hours(world: World) -> None:
    # G-18: sums by the hour and by the week; a week reads days, its edges hours
    await a_busy_and_an_idle_rank(world)
    for _ in range(50):
        world.clock.advance(hours=1)
        await sample(world, {0: 0.9, 1: 0.0})
        await tick(world)
    # A day's part by its hours, or as the whole day less its hours outside (the 20 hours
    # from 02:00); within one day; whole days; the period past what was counted.
    first = T0.replace(hour=0, minute=0, second=0, microsecond=0)
    for start, end in (
        (first + timedelta(hours=2), first + timedelta(hours=46)),
        (first + timedelta(hours=5), counting.minute_floor(world.clock.now()).replace(minute=0)),
        (first + timedelta(hours=20), first + timedelta(hours=23)),
        (first + timedelta(hours=1), first + timedelta(hours=23)),
        (first, first + timedelta(days=2)),
        (first + timedelta(hours=30), first + timedelta(days=4, hours=7)),
    ):
        async with world.db.read() as session:
            mixed = await ledger_queries.hour_sums(session, "run", start, end)
            rows = await session.scalars(
                select(GoodputHour).where(
                    GoodputHour.scope == "run", GoodputHour.hour >= start, GoodputHour.hour < end
                )
            )
            naive: dict[tuple[int, str, bool], float] = defaultdict(float)
            for r in rows:
                naive[(r.scope_id, r.category, r.held)] += r.gpu_seconds
            report = await reports.report(session, Viewer(None), "run", Period(start, end))
        expected = {k: round(v, 3) for k, v in naive.items() if round(v, 3)}
        assert {k[:3]: round(k[3], 3) for k in mixed} == expected, (start, end)
        # by run, the report reads two rows of each run's running totals: the same figures
        run_id = await run_id_of(world, "llama-sft")
        by_run = {
            (run_id, c.value, held): round(seconds, 3)
            for row in report.rows
            for held, part in ((True, row.ledger.held), (False, row.ledger.not_held))
            for c, seconds in part.items()
            if round(seconds, 3)
        }
        assert by_run == expected, (start, end)
    async with world.db.read() as session:
        await assert_run_totals_match_the_hours(session)


async def test_a_report_by_run_from_before_the_pruned_hours_sums_the_hours_still_kept(
    world: World,
) -> None:
    # G-43 with G-18: the running totals keep the hour before the pruned ones
    await a_busy_and_an_idle_rank(world)
    for _ in range(5):
        world.clock.advance(hours=1)
        await sample(world, {0: 0.9, 1: 0.0})
        await tick(world)
    first = T0.replace(minute=0, second=0, microsecond=0)
    async with world.db.transaction() as session:
        await ledger_writes.prune(session, first + timedelta(hours=2))
    async with world.db.read() as session:
        hours = await session.scalars(select(GoodputRunTotal.__table__.c.hour))
        assert min(hours) == first + timedelta(hours=1)  # the hour before the first kept
        period = Period(first - timedelta(days=1), first + timedelta(hours=6))
        report = await reports.report(session, Viewer(None), "run", period)
        kept = await session.scalars(select(GoodputHour).where(GoodputHour.scope == "run"))
        naive: dict[tuple[str, bool], float] = defaultdict(float)
        for r in kept:
            naive[(r.category, r.held)] += r.gpu_seconds
    [row] = report.rows
    got = {
        (c.value, held): round(seconds, 3)
        for held, part in ((True, row.ledger.held), (False, row.ledger.not_held))
        for c, seconds in part.items()
        if round(seconds, 3)
    }
    assert got == {k: round(v, 3) for k, v in naive.items() if round(v, 3)}
    assert got[(Category.PRODUCTIVE.value, True)] > 0


async def test_running_totals_fill_the_hours_between_cells_and_follow_a_change_back(
    world: World,
) -> None:
    # G-18: any whole hours of a run are two rows of its running totals apart, however its
    # cells come (an hour without cells; a cell changed hours later; taken back to nothing)
    await world.submit(workers=1, gpus=4)
    async with world.db.read() as session:
        run = (await session.scalars(select(Run))).one()
    run_id, ws, cluster = run.id, run.workspace_id, run.cluster_id
    hour = T0.replace(minute=0, second=0, microsecond=0)

    def cell(at: datetime, category: str, held: bool) -> ledger_writes.CellKey:
        return (at, ws, cluster, "run", run_id, category, held)

    steps: list[dict[ledger_writes.CellKey, float]] = [
        {cell(hour, "waiting", False): 600.0},
        {cell(hour + timedelta(hours=3), "productive", True): 3600.0},  # two hours skipped
        {cell(hour + timedelta(hours=1), "idle", True): 60.0},  # an earlier hour, later
        {cell(hour + timedelta(hours=1), "idle", True): -60.0},  # taken back: emptied
        {cell(hour, "waiting", False): -600.0, cell(hour, "starting", True): 600.0},
    ]
    for step in steps:
        async with world.db.transaction() as session:
            await ledger_writes.add_to_hours(session, step)
        async with world.db.read() as session:
            await assert_run_totals_match_the_hours(session)
    async with world.db.read() as session:
        rows = (
            await session.execute(
                select(GoodputRunTotal.__table__).order_by(GoodputRunTotal.__table__.c.hour)
            )
        ).all()
        period = Period(hour + timedelta(hours=1), hour + timedelta(hours=4))
        report = await reports.report(session, Viewer(None), "run", period)
    assert [r.hour for r in rows] == [hour + timedelta(hours=h) for h in range(4)]
    assert [r.last for r in rows] == [False, False, False, True]
    assert [r.starting_held for r in rows] == [600.0] * 4
    assert [r.waiting_not_held for r in rows] == [0.0] * 4
    [row] = report.rows
    assert row.ledger.held[Category.PRODUCTIVE] == 3600.0
    assert row.ledger.held[Category.STARTING] == 0.0


async def test_a_steady_minute_moves_the_running_totals_on_over_hours_without_cells(
    world: World,
) -> None:
    # The steady minute's running totals are added to the run's last row, not recomputed: a
    # minute hours after that row (no cells between) repeats it for each hour between, as
    # refresh_run_totals does (PostgreSQL: SQLite counts every worker by the rules)
    if world.db.engine.dialect.name != "postgresql":
        pytest.skip("the steady minute's statement is PostgreSQL's")
    await a_busy_and_an_idle_rank(world)
    world.clock.advance(minutes=3)
    await tick(world)
    hour = T0.replace(minute=0, second=0, microsecond=0)
    later = counting.minute_floor(world.clock.now()) + timedelta(hours=3)
    async with world.db.transaction() as session:
        done = await ledger_writes.count_steady_minute(session, later, [], 0.05)
    async with world.db.read() as session:
        await assert_run_totals_match_the_hours(session)
        rows = (
            await session.execute(
                select(GoodputRunTotal.__table__).order_by(GoodputRunTotal.__table__.c.hour)
            )
        ).all()
    assert done.workers == 2 and done.winding_down == [] and done.orphans == 0
    assert [r.hour for r in rows] == [hour + timedelta(hours=h) for h in range(4)]
    assert [r.last for r in rows] == [False, False, False, True]


async def test_a_run_submitted_after_one_was_deleted_starts_a_ledger_of_its_own(
    world: World,
) -> None:
    # G-18: a deleted run stays (runs -a), with its ledger; a new run of its name has its own
    await a_busy_and_an_idle_rank(world)
    world.clock.advance(minutes=5)
    await tick(world)
    first = await world.run("llama-sft")
    async with world.db.transaction() as session:
        await lifecycle.delete_run(session, world.clock, first, "alice", ledger=counting)
    world.clock.advance(minutes=1)
    await tick(world)
    again = await world.submit(gpus=8)
    assert again.id != first.id
    world.clock.advance(minutes=2)
    await tick(world)
    async with world.db.read() as session:
        ledger = (
            await run_goodput.run_ledgers(
                session, [(again.id, again.created_at)], world.clock.now()
            )
        )[again.id]
    assert ledger.held[Category.PRODUCTIVE] == 0.0  # the deleted run's busy rank is not its
    waited = counting.minute_floor(world.clock.now()) - again.created_at
    assert round(ledger.not_held[Category.WAITING], 3) == round(2 * 8 * waited.total_seconds(), 3)
    assert round(ledger.allocated, 3) == 0.0  # not placed: nothing held
