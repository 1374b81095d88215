"""Property tests of the tick on SQLite and PostgreSQL (hypothesis): random worker histories
with transitions at any second, some recorded late (a stall dated back to the last
progress), some minutes' samples arriving late (kept by the agent while the server was away,
within the window), counted by ticks at random moments, retried and duplicated, the run maybe
deleted at any second between them. What the tick wrote equals the pure computation over the whole
history, to the second (DESIGN §4)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import datetime, timedelta

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select, update

from backend.accounting import (
    counting,
    interval_queries,
    ledger_queries,
    reports,
    repository,
    rules,
)
from backend.accounting.rules import Category, Interval, Ledger, Period, PhaseChange
from backend.accounting.viewers import Viewer
from backend.db import Database
from backend.lifecycle.states import Phase
from backend.metrics.rules import BY_NAME
from backend.models import (
    AccountingMark,
    GoodputDay,
    GoodputHour,
    GoodputInterval,
    GoodputOpenInterval,
    GoodputRecount,
    GoodputRunTotal,
    MetricSample,
    Run,
    StateTransition,
    Worker,
)
from tests.accounting.totals import assert_run_totals_match_the_hours
from tests.lifecycle.world import World
from tests.support import SEED_TIME, FakeClock, Tenancy

T0 = SEED_TIME.replace(minute=50, second=0, microsecond=0)  # ten minutes before an hour
SPAN = 2 * 3600  # seconds of history
UTILIZATION = BY_NAME["task_gpu_utilization_ratio"].id
PHASES = [p.value for p in Phase if p != Phase.WAITING]
ON_MACHINE = {Phase.STARTING, Phase.RESTART, Phase.RUNNING, Phase.STALLED}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def busy(minute: int) -> float | None:
    """Each minute's utilisation: busy, idle or not sampled, by the minute."""
    return [0.9, 0.01, None, 0.9, 0.9][minute % 5]


@st.composite
def workers(draw: st.DrawFn) -> list[list[tuple[int, str, int]]]:
    """One to three workers of 8 GPUs: phase changes (second, phase, recorded how late)."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        seconds = sorted(draw(st.sets(st.integers(1, SPAN), max_size=12)))
        changes = [
            (
                s,
                draw(st.sampled_from(PHASES)),
                draw(st.sampled_from([0, 0, 0, 45, 200, 900])),  # late: after its time
            )
            for s in seconds
        ]
        out.append(changes)
    return out


async def forget(db: Database) -> None:
    """An empty cluster between examples (the machines and tenancy stay)."""
    async with db.transaction() as session:
        for model in (
            GoodputHour,
            GoodputDay,
            GoodputRunTotal,
            GoodputInterval,
            GoodputOpenInterval,
            AccountingMark,
            MetricSample,
            GoodputRecount,
            StateTransition,
            Worker,
            Run,
        ):
            await session.execute(delete(model))


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    histories=workers(),
    ticks=st.lists(st.integers(0, SPAN + 120), max_size=40),
    twice=st.booleans(),
    deleted=st.one_of(st.none(), st.integers(1, SPAN)),
    late_samples=st.dictionaries(
        st.integers(0, SPAN // 60), st.sampled_from([45, 200, 500]), max_size=30
    ),
)
# Issue 36 (a fresh clone's `make test`; @reproduce_failure('6.170.17',
# b'AEEBAUEDAUECAUEBAEEMQQVBAkEAQQJBAAFCApQAAEEAAA==')): a worker ended at its first second,
# recorded 15 minutes late, after a tick in the next hour had counted it running there. The
# take-back emptied that hour's cells, and its running-total row stayed, marked last.
@example(
    histories=[[(1, "ended", 900), (2, "running", 0), (3, "running", 0)]],
    ticks=[660],
    twice=False,
    deleted=None,
    late_samples={},
)
async def test_any_ticks_over_any_history_write_the_pure_ledgers_and_intervals(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    histories: list[list[tuple[int, str, int]]],
    ticks: list[int],
    twice: bool,
    deleted: int | None,
    late_samples: dict[int, int],
) -> None:
    # DESIGN §4 invariants 1 (conservation, ticks retried, late, duplicated), 2 (transitions
    # split minutes), 3 (a late transition moves time already counted, and so do samples that
    # arrive late: issue 20), 4 (intervals listed)
    await forget(db)
    world = World(db, FakeClock(T0), tenancy)
    machine_ids = [await world.machine(name, pool="a") for name in ("gpu-1", "gpu-2")]
    run = await world.submit(workers=len(histories), gpus=8)
    async with db.read() as session:
        worker_ids = list(
            await session.scalars(
                select(Worker.id).where(Worker.run_id == run.id).order_by(Worker.rank)
            )
        )
    # Every change, as the pure rules read it, and as it is recorded (at its time + its delay).
    truth: dict[int, list[PhaseChange]] = {}
    recorded: list[tuple[datetime, StateTransition]] = []
    gone = None if deleted is None else at(deleted)
    for worker_id, changes in zip(worker_ids, histories, strict=True):
        truth[worker_id] = [PhaseChange(T0, Phase.WAITING, 8)]
        for n, (second, phase, late) in enumerate(changes):
            if gone is not None and at(second + late) >= gone:
                continue  # not recorded before the run was deleted: never recorded
            machine = machine_ids[n % 2] if phase in ON_MACHINE else None
            truth[worker_id].append(PhaseChange(at(second), phase, 8, machine))
            row = StateTransition(
                run_id=run.id,
                worker_id=worker_id,
                transition_at=at(second),
                state="Running",
                reason="",
                phase=phase,
                held_gpus=8 if machine else 0,
                gpus=8,
                machine_id=machine,
            )
            recorded.append((at(second + late), row))
        if gone is not None:  # deleted: ended there (lifecycle.delete_run's transitions)
            truth[worker_id].append(PhaseChange(gone, Phase.ENDED, 8))
    end = at(SPAN + 960)  # after the latest recording
    moments = [*sorted({at(t) for t in ticks}), end]

    # Samples: every minute's (at its half), those of the ``late_samples`` minutes when they arrive.
    def samples(minute: int) -> list[MetricSample]:
        value = busy(int(at(minute * 60).timestamp()) // 60)
        if value is None or (gone is not None and at(minute * 60 + 30) >= gone):
            return []  # none once it is deleted
        return [
            MetricSample(
                worker_id=w,
                metric=UTILIZATION,
                gpu=0,
                ts=int(at(minute * 60 + 30).timestamp() * 1000),
                value=value,
                machine_id=machine_ids[0],
            )
            for w in worker_ids
        ]

    arrivals: dict[datetime, list[int]] = defaultdict(list)
    for minute, delay in late_samples.items():
        arrivals[at(minute * 60 + 30 + delay)].append(minute)
    never = {m for m, d in late_samples.items() if gone is not None and at(m * 60 + 30 + d) >= gone}
    async with db.transaction() as session:
        await session.execute(  # placed (their samples are stored, and counted again)
            update(Worker).where(Worker.run_id == run.id).values(machine_id=machine_ids[0])
        )
        session.add_all(
            s
            for minute in range(SPAN // 60 + 17)
            if minute not in late_samples
            for s in samples(minute)
        )
    ticking = set(moments)
    for moment in sorted(ticking | set(arrivals)):
        if gone is not None and gone <= moment:
            await delete_run(db, run.id, worker_ids, recorded, gone)
            gone = None
        if moment in arrivals and (deleted is None or moment < at(deleted)):
            async with db.transaction() as session:  # as gateway.service.metrics stores them
                came = [s for minute in arrivals[moment] for s in samples(minute)]
                session.add_all(came)
                await session.flush()
                earliest: dict[int, datetime] = {}
                for s in came:
                    t = datetime.fromtimestamp(s.ts / 1000, T0.tzinfo)
                    earliest[s.worker_id] = min(t, earliest.get(s.worker_id, t))
                await counting.samples_arrived(session, FakeClock(moment), machine_ids[0], earliest)
        if moment not in ticking:
            continue
        due = [row for when, row in recorded if when <= moment and row.id is None]
        async with db.transaction() as session:
            session.add_all(due)
        for _ in range(2 if twice else 1):
            async with db.transaction() as session:
                await counting.tick(session, FakeClock(moment))
    assert all(row.id is not None for _, row in recorded) or deleted is not None
    until = counting.minute_floor(end)

    def utilisation(minute: datetime, _: datetime) -> float | None:
        if deleted is not None and minute + timedelta(seconds=30) >= at(deleted):
            return None  # its sample would have come after the deletion: there is none
        if (minute - T0) // timedelta(minutes=1) in never:
            return None  # it would have come late, after the deletion: never stored
        return busy(int(minute.timestamp()) // 60)

    pure = {w: rules.intervals(changes, T0, until, utilisation) for w, changes in truth.items()}
    # The ledgers: the run's cells equal the pure sums, category by category.
    async with db.read() as session:
        cells = await ledger_queries.hour_sums(session, "run", T0 - rules.HOUR, until + rules.HOUR)
        written = await interval_queries.intervals_of(
            session,
            start=T0 - rules.HOUR,
            end=until + rules.HOUR,
            workspace_ids=None,
            limit=100_000,
        )
        await assert_run_totals_match_the_hours(session)
        report = await reports.report(
            session,
            Viewer(None),
            "run",
            Period(rules.hour_floor(T0), rules.hour_floor(until) + rules.HOUR),
        )
    expected = Ledger.of(i for parts in pure.values() for i in parts)
    # The report by run (from the running totals) says the same.
    for c in Category:
        held = sum(row.ledger.held[c] for row in report.rows)
        not_held = sum(row.ledger.not_held[c] for row in report.rows)
        assert round(held, 3) == round(expected.held[c], 3), c
        assert round(not_held, 3) == round(expected.not_held[c], 3), c
    got: dict[tuple[str, bool], float] = defaultdict(float)
    for _, category, held, seconds in cells:
        got[(category, held)] += seconds
    for c in Category:
        assert round(got[(c.value, True)], 3) == round(expected.held[c], 3), c
        assert round(got[(c.value, False)], 3) == round(expected.not_held[c], 3), c
    # The intervals: each worker's, merged where they touch, are the pure ones.
    by_worker: dict[int, list[Interval]] = defaultdict(list)
    for r in written:
        by_worker[r.worker_id].append(
            Interval(r.start_at, r.end_at, Category(r.category), r.held, r.gpus, r.machine_id)
        )
    for worker_id, parts in pure.items():
        mine = sorted(by_worker[worker_id], key=lambda i: i.start)
        for a, b in itertools.pairwise(mine):
            assert a.end <= b.start  # no second twice
        for i in mine:
            assert rules.hour_floor(i.start) == rules.hour_floor(i.end - timedelta(microseconds=1))
        assert merged(mine) == merged(parts)


async def delete_run(
    db: Database,
    run_id: int,
    worker_ids: list[int],
    recorded: list[tuple[datetime, StateTransition]],
    moment: datetime,
) -> None:
    """As lifecycle.delete_run does at ``moment``: what was recorded by then, each worker's
    end, its time counted, then the workers (and their history) deleted."""
    async with db.transaction() as session:
        session.add_all(row for when, row in recorded if when < moment and row.id is None)
        counted = await repository.hold_mark(session)
        session.add_all(
            StateTransition(
                run_id=run_id,
                worker_id=w,
                transition_at=moment,
                state="Deleted",
                reason="",
                phase=Phase.ENDED.value,
                held_gpus=0,
                gpus=8,
            )
            for w in worker_ids
        )
        await session.flush()
        await counting.count_deleted(session, worker_ids, moment, counted)
        await session.execute(delete(Worker).where(Worker.run_id == run_id))


def merged(parts: list[Interval]) -> list[Interval]:
    """Touching intervals of one kind in one hour as one: the same time, however cut."""
    out: list[Interval] = []
    for p in sorted(parts, key=lambda i: i.start):
        last = out[-1] if out else None
        if (
            last is not None
            and last.end == p.start
            and (last.category, last.held, last.gpus, last.machine_id)
            == (p.category, p.held, p.gpus, p.machine_id)
            and rules.hour_floor(last.start) == rules.hour_floor(p.start)
        ):
            out[-1] = Interval(last.start, p.end, p.category, p.held, p.gpus, p.machine_id)
        else:
            out.append(p)
    return out
