"""The tick on SQLite and PostgreSQL, issue 20: samples that come after their minute was
counted (the agent kept them while the server was away) are counted again, within the window;
winding down is productive only after the worker ran, and for at most the stop's grace."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import select

from backend.accounting import counting, interval_queries, repository, rules
from backend.accounting.rules import Category
from backend.gateway import service as agents
from backend.lifecycle import service as lifecycle
from backend.metrics.rules import SampleIn
from backend.models import GoodputRecount, Worker
from tests.lifecycle.world import World
from tests.support.accounting import (
    a_busy_and_an_idle_rank,
    all_intervals,
    expected,
    ledger,
    sample,
    tick,
)
from tests.support.stream import statements

PRODUCTIVE = (Category.PRODUCTIVE.value, True)
IDLE = (Category.IDLE.value, True)
STARTING = (Category.STARTING.value, True)


async def deliver(world: World, kept: list[tuple[datetime, dict[int, float]]]) -> None:
    """What the agent kept, sent now that the server is back: each moment's utilisation by
    rank, in one batch per machine (as the agent's outbox sends it)."""
    async with world.db.transaction() as session:
        workers = list(await session.scalars(select(Worker).order_by(Worker.rank)))
        for w in workers:
            assert w.machine_id is not None
            samples = [
                SampleIn(w.id, "task_gpu_utilization_ratio", gpu, int(at.timestamp() * 1000), v)
                for at, busy in kept
                for gpu in w.gpu_ids
                if (v := busy.get(w.rank)) is not None
            ]
            await agents.metrics(session, w.machine_id, samples, world.clock)


async def server_away(world: World, minutes: int) -> list[tuple[datetime, dict[int, float]]]:
    """The server is away: the agent samples every 10 s (rank 0 busy, rank 1 idle) and keeps
    the samples; no tick runs."""
    kept = []
    for _ in range(minutes * 6):
        world.clock.advance(seconds=10)
        kept.append((world.clock.now(), {0: 0.9, 1: 0.01}))
    return kept


async def counted_then_away(world: World, minutes: int) -> list[tuple[datetime, dict[int, float]]]:
    """A busy and an idle rank, a minute sampled and counted, then the server away for
    ``minutes`` (what the agent kept meanwhile), and a tick once it is back."""
    await a_busy_and_an_idle_rank(world)
    world.clock.advance(minutes=1)
    await sample(world, {0: 0.9, 1: 0.01})
    await tick(world)
    kept = await server_away(world, minutes)
    await tick(world)
    return kept


async def test_samples_kept_while_the_server_was_away_are_counted_again(world: World) -> None:
    # seed G-3 (productive: running, its GPUs busy), G-5 (idle); DESIGN §4 invariants 1 and 3
    await a_busy_and_an_idle_rank(world)
    for _ in range(3):
        world.clock.advance(minutes=1)
        await sample(world, {0: 0.9, 1: 0.01})
        await tick(world)
    kept = await server_away(world, 3)
    back = await tick(world)  # back: the minutes away are counted before the samples come
    assert back.recounted_from is None
    while_away = await ledger(world)
    assert while_away[IDLE] > 2 * 8 * 120  # both ranks idle for the minutes away: no samples
    await deliver(world, kept)
    async with world.db.read() as session:
        asked = list(await session.scalars(select(GoodputRecount.since)))
    assert asked and min(asked) <= kept[0][0]
    world.clock.advance(seconds=30)
    again = await tick(world)
    assert again.recounted_from is not None and again.recounted_from <= kept[0][0]
    until = counting.minute_floor(world.clock.now())
    got = await ledger(world)
    assert got == await expected(world, until)  # as if the samples had come in time
    assert got[PRODUCTIVE] > while_away.get(PRODUCTIVE, 0) + 8 * 170
    async with world.db.read() as session:
        assert list(await session.scalars(select(GoodputRecount))) == []  # done once
    # The intervals still add up to the ledger, to the second.
    intervals = await all_intervals(world)
    assert sum(seconds(i) for i in intervals) == pytest.approx(sum(got.values()))


async def test_samples_later_than_the_window_are_kept_and_not_counted_again(
    world: World,
) -> None:
    kept = await counted_then_away(world, 15)
    before = await ledger(world)
    await deliver(world, kept)
    await tick(world)  # the same minute: only what came late is counted again
    got = await ledger(world)
    # Rank 0's last ten minutes moved from idle to productive, the five before stayed idle.
    window = rules.LATE_SAMPLES_WINDOW.total_seconds()
    assert got[PRODUCTIVE] - before.get(PRODUCTIVE, 0) == pytest.approx(8 * window)
    assert before[IDLE] - got[IDLE] == pytest.approx(8 * window)
    assert sum(got.values()) == pytest.approx(sum(before.values()))


async def test_samples_of_a_minute_not_counted_yet_ask_for_no_recount(world: World) -> None:
    await a_busy_and_an_idle_rank(world)
    world.clock.advance(minutes=2)
    await tick(world)
    world.clock.advance(seconds=20)
    await sample(world, {0: 0.9, 1: 0.01})  # in time: the tick has not counted this minute
    async with world.db.read() as session:
        assert list(await session.scalars(select(GoodputRecount))) == []


async def test_a_worker_that_never_ran_is_never_productive(world: World) -> None:
    # seed G-4 (winding down when its owner asked) and G-8 (placed, not yet running): issue
    # 20's worker stopped before it ran, its stop never done, was charged 27 s productive
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=8)
    await world.schedule()
    world.clock.advance(seconds=20)
    async with world.db.transaction() as session:
        await lifecycle.stop_run(session, world.clock, await world.run("llama-sft"), "alice")
    world.clock.advance(minutes=3)
    await tick(world)
    got = await ledger(world)
    assert PRODUCTIVE not in got
    assert got == await expected(world, counting.minute_floor(world.clock.now()))
    phases = [p for _, _, p, _ in await world.phases("llama-sft-0")]
    assert phases[-1] == "stopping:owner"  # still stopping, counted as placed, not running
    assert set(got) == {STARTING}  # placed at once: no wait


@pytest.mark.parametrize("done_after", [3, None])
async def test_winding_down_is_productive_for_at_most_the_grace_period(
    world: World, done_after: int | None
) -> None:
    # seed G-4: winding down when its owner asked, while the process lives, at most its grace
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=8)
    await world.schedule()
    await world.start("llama-sft-0")
    world.clock.advance(minutes=1)
    await sample(world, {0: 0.9})
    await tick(world)
    world.clock.advance(seconds=40)
    await sample(world, {0: 0.9})
    async with world.db.transaction() as session:
        await lifecycle.stop_run(session, world.clock, await world.run("llama-sft"), "alice")
    stopped = world.clock.now()
    if done_after is not None:
        world.clock.advance(seconds=done_after)
        await world.report("llama-sft-0", "exited", exit_code=143)
    for _ in range(4):  # ticks every minute; the stop never done: the agent is gone
        world.clock.advance(minutes=1)
        await tick(world)
    got = await ledger(world)
    until = counting.minute_floor(world.clock.now())
    assert got == await expected(world, until)
    # From the stop on (the winding down continues the running minute's interval).
    intervals = [i for i in await all_intervals(world) if i.end_at > stopped]
    winding = sum(after(i, stopped) for i in intervals if i.category == Category.PRODUCTIVE.value)
    grace = rules.STOP_GRACE.total_seconds()
    assert winding == pytest.approx(8 * (done_after if done_after is not None else grace))
    overdue = sum(after(i, stopped) for i in intervals if i.category == Category.IDLE.value)
    if done_after is None:  # idle (GPUs held and not used) from the grace's end to now
        assert overdue == pytest.approx(8 * ((until - stopped).total_seconds() - grace))
    else:
        assert overdue == 0
    async with world.db.read() as session:
        opened = await repository.open_intervals(session)
    assert [o.category for o in opened.values()] == (["idle"] if done_after is None else [])


def seconds(i: interval_queries.IntervalRow) -> float:
    return (i.end_at - i.start_at).total_seconds() * i.gpus


def after(i: interval_queries.IntervalRow, moment: datetime) -> float:
    return (i.end_at - max(i.start_at, moment)).total_seconds() * i.gpus


def test_the_grace_is_the_agents() -> None:
    from agent.executor import STOP_GRACE_SECONDS

    assert rules.STOP_GRACE.total_seconds() == STOP_GRACE_SECONDS


async def test_kept_samples_of_many_machines_in_one_batch_ask_each_its_recount(
    world: World,
) -> None:
    """The stream's writers write many machines' samples in one batch (issue 40): the tick's
    mark is read once for them all, each worker's kept samples ask its recount, and a worker's
    samples sent by a machine it is not placed on ask none."""
    kept = await counted_then_away(world, 3)
    async with world.db.read() as session:
        workers = list(await session.scalars(select(Worker).order_by(Worker.rank)))

    def samples(w: Worker, moments: list[tuple[datetime, dict[int, float]]]) -> list[SampleIn]:
        return [
            SampleIn(w.id, "task_gpu_utilization_ratio", 0, int(at.timestamp() * 1000), 0.5)
            for at, _ in moments
        ]

    first, second = workers
    assert first.machine_id is not None and second.machine_id is not None
    batches = [
        # rank 1's first minute sent by rank 0's machine: not its own, no recount from it
        (first.machine_id, samples(first, kept) + samples(second, kept)),
        (second.machine_id, samples(second, kept[6:])),  # its own, its second minute only
    ]
    with statements(world.db) as seen:
        async with world.db.transaction() as session:
            await agents.reports(session, world.clock, [], batches)
    assert sum("accounting_mark" in s for s in seen) == 1
    async with world.db.read() as session:
        asked = sorted(
            await session.execute(select(GoodputRecount.worker_id, GoodputRecount.since))
        )
    minute = counting.minute_floor
    assert asked == [(first.id, minute(kept[0][0])), (second.id, minute(kept[6][0]))]
