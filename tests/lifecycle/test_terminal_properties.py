"""Property test of issue 19 through the real service path, on SQLite and PostgreSQL: a gang's
workers exit at random moments, their reports arrive late and twice, a gang stop (its owner, a
drain, a lost machine) races the exits, and the goodput tick runs in between. Whatever the
order, every worker's counted time is its GPUs times its held wall time (placement to its own
end), the rest of what it asked for is counted not held, and an ended worker counts no more.
A lost machine went silent some time before its loss is found (issue 36): its worker holds its
GPUs until then, as failure from the silence on, whatever was counted of it before."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select

from backend.accounting import counting
from backend.db import Database
from backend.lifecycle import service as lifecycle
from backend.lifecycle.sentences import MACHINE_LOST
from backend.lifecycle.states import ENDED_STATES
from backend.models import (
    AccountingMark,
    AgentCommand,
    Event,
    GoodputDay,
    GoodputHour,
    GoodputInterval,
    GoodputOpenInterval,
    GoodputRunTotal,
    MetricSample,
    Run,
    StateTransition,
    Worker,
)
from tests.lifecycle.world import World
from tests.support import SEED_TIME, FakeClock, Tenancy

T0 = SEED_TIME
GPUS = 8
PLACED = T0 + timedelta(seconds=1)
EXAMPLES = int(os.environ.get("ASTRAEUS_PROPERTY_EXAMPLES", "30"))


def ms(n: int) -> datetime:
    return T0 + timedelta(milliseconds=n)


@dataclass(frozen=True)
class Exit:
    at: int  # when its container ended, by its agent (ms after T0)
    code: int
    late: int  # how long its report took (ms)
    twice: bool  # its report is delivered again, later


@dataclass(frozen=True)
class Stop:
    kind: str  # owner | drain | lost
    at: int  # ms after T0, by the server's clock
    worker: int  # whose machine is drained or lost
    silent: int = 0  # a lost machine's last contact (ms after T0): none of its news after it


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Exit], Stop | None, list[int]]:
    n = draw(st.integers(1, 3))
    exits = [
        Exit(
            at=draw(st.integers(3_000, 300_000)),
            code=draw(st.sampled_from([0, 1, 137])),
            late=draw(st.sampled_from([0, 0, 130, 4_000, 90_000, 200_000])),
            twice=draw(st.booleans()),
        )
        for _ in range(n)
    ]
    stop = draw(
        st.one_of(
            st.none(),
            st.builds(
                Stop,
                kind=st.sampled_from(["owner", "drain", "lost"]),
                at=st.integers(2_500, 400_000),
                worker=st.integers(0, n - 1),
            ),
        )
    )
    if stop is not None and stop.kind == "lost":
        e = exits[stop.worker]
        news = [e.at + e.late, *([e.at + e.late + 1_000] if e.twice else [])]
        heard = max([2_000, *(n for n in news if n < stop.at)])
        if heard <= stop.at:
            stop = replace(stop, silent=draw(st.integers(heard, stop.at)))
        else:  # its last news came a moment before the loss was found
            stop = replace(stop, silent=stop.at)
    ticks = draw(st.lists(st.integers(2_000, 600_000), max_size=8))
    return exits, stop, ticks


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
            AgentCommand,
            Event,
            StateTransition,
            Worker,
            Run,
        ):
            await session.execute(delete(model))


async def counted(db: Database, worker_ids: list[int]) -> dict[int, tuple[float, float, int]]:
    """Each worker's counted GPU-seconds up to the tick's mark: held, all, open intervals."""
    out: dict[int, tuple[float, float, int]] = {}
    async with db.read() as session:
        mark = await session.scalar(select(AccountingMark.counted_until))
        assert mark is not None
        for w in worker_ids:
            closed = list(
                await session.scalars(select(GoodputInterval).where(GoodputInterval.worker_id == w))
            )
            opened = list(
                await session.scalars(
                    select(GoodputOpenInterval).where(GoodputOpenInterval.worker_id == w)
                )
            )
            parts = [(i.start_at, i.end_at, i.held, i.gpus) for i in closed]
            parts += [(i.start_at, mark, i.held, i.gpus) for i in opened]
            held = sum((b - a).total_seconds() * g for a, b, h, g in parts if h)
            every = sum((b - a).total_seconds() * g for a, b, _, g in parts)
            out[w] = (round(held, 3), round(every, 3), len(opened))
    return out


async def failure_held(db: Database, worker_id: int, start: datetime, end: datetime) -> float:
    """The worker's GPU-seconds counted as failure, held, in [start, end)."""
    async with db.read() as session:
        parts = await session.scalars(
            select(GoodputInterval).where(
                GoodputInterval.worker_id == worker_id,
                GoodputInterval.category == "failure",
                GoodputInterval.held.is_(True),
            )
        )
        return round(
            sum(
                max(0.0, (min(i.end_at, end) - max(i.start_at, start)).total_seconds()) * i.gpus
                for i in parts
            ),
            3,
        )


async def run_ledger(db: Database, run_id: int) -> float:
    async with db.read() as session:
        hours = await session.scalars(
            select(GoodputHour.gpu_seconds).where(
                GoodputHour.scope == "run", GoodputHour.scope_id == run_id
            )
        )
        return round(sum(hours), 3)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    # Each example is a cluster's life on a database: shrinking one takes minutes, not seconds.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(scenario=scenarios())
async def test_any_interleaving_of_exits_stops_late_reports_and_ticks_counts_held_time_once(
    db: Database,
    tenancy: Tenancy,
    scenario: tuple[list[Exit], Stop | None, list[int]],
) -> None:
    exits, stop, ticks = scenario
    await forget(db)
    world = World(db, FakeClock(T0), tenancy)
    names = [f"gpu-{n}" for n in range(len(exits))]
    machine_of_name = {name: await world.machine(name) for name in names}
    await world.submit(workers=len(exits), gpus=GPUS, restart_policy="never")
    world.clock.moment = PLACED
    assert (await world.schedule()).placed
    world.clock.moment = T0 + timedelta(seconds=2)
    workers = await world.workers("llama-sft")
    await world.start(*(w.name for w in workers))
    run = await world.run("llama-sft")
    placed = {w.id: (w.name, w.machine_id) for w in await world.workers("llama-sft")}
    ids = [w.id for w in workers]
    assert set(m for _, m in placed.values()) <= set(machine_of_name.values())

    # The server's timeline: each report's delivery (and its repeat), the stop, the ticks.
    timeline: list[tuple[int, int, str, int]] = []
    for i, e in enumerate(exits):
        timeline.append((e.at + e.late, 0, "exit", i))
        if e.twice:
            timeline.append((e.at + e.late + 1_000, 0, "exit", i))
    if stop is not None:
        timeline.append((stop.at, 1, stop.kind, stop.worker))
    timeline += [(t, 2, "tick", 0) for t in ticks]
    delivered: dict[int, int] = {}  # worker -> when its exit was first delivered
    lost_at: int | None = None
    for moment, _, kind, i in sorted(timeline):
        world.clock.moment = max(world.clock.moment, ms(moment))
        worker_id = ids[i]
        name, machine_id = placed[worker_id]
        assert machine_id is not None
        async with db.transaction() as session:
            if kind == "exit":
                delivered.setdefault(i, moment)
                await lifecycle.report(
                    session,
                    world.clock,
                    machine_id=machine_id,
                    worker_id=worker_id,
                    kind="exited",
                    at=ms(exits[i].at),
                    exit_code=exits[i].code,
                    attempt=1,
                )
            elif kind == "owner":
                row = await session.get(Run, run.id)
                assert row is not None
                if row.state not in ENDED_STATES:
                    await lifecycle.stop_run(session, world.clock, row, "ana")
            elif kind == "drain":
                await lifecycle.machine_drained(session, world.clock, machine_id, name)
            elif kind == "lost":
                assert stop is not None
                lost_at = moment
                await lifecycle.machine_lost(session, world.clock, machine_id, ms(stop.silent))
            else:
                await counting.tick(session, world.clock)

    # Each worker's own end: its exit, unless its machine was lost before the report came.
    ends: dict[int, datetime] = {}
    for i, e in enumerate(exits):
        on_lost = stop is not None and stop.kind == "lost" and stop.worker == i
        if on_lost and lost_at is not None and lost_at < delivered[i]:
            ends[ids[i]] = ms(lost_at)
        else:
            ends[ids[i]] = ms(e.at)
    rows = {w.id: w for w in await world.workers("llama-sft")}
    final = await world.run("llama-sft")
    for worker_id, end in ends.items():
        assert rows[worker_id].state in ("Completed", "Failed", "Stopped", "Pending")
        if rows[worker_id].reason == MACHINE_LOST:
            assert end == ms(lost_at or 0)

    async with db.read() as session:
        history = (
            await session.execute(
                select(
                    StateTransition.worker_id,
                    StateTransition.transition_at,
                    StateTransition.state,
                    StateTransition.phase,
                ).order_by(StateTransition.id)
            )
        ).all()
    completed = {w for w, _, state, _ in history if state == "Completed"}
    note(f"timeline {sorted(timeline)}; exits {exits}; history {[tuple(h) for h in history]}")
    last = max(m for m, *_ in timeline)
    for later in (2, 12):  # minutes after the last news: then ten more
        world.clock.moment = ms(last) + timedelta(minutes=later)
        async with db.transaction() as session:
            await counting.tick(session, world.clock)
        async with db.read() as session:
            mark = await session.scalar(select(AccountingMark.counted_until))
        assert mark is not None
        got = await counted(db, ids)
        for worker_id, end in ends.items():
            held, every, still_open = got[worker_id]
            assert held == round((end - PLACED).total_seconds() * GPUS, 3), (worker_id, got)
            if final.state in ENDED_STATES:
                # It asked from its submission to its end, and counts no more.
                assert every == round((end - T0).total_seconds() * GPUS, 3), (worker_id, got)
                assert still_open == 0
            else:  # queued again (a drain): it asks again, not held, from its end (or, when
                # it had completed, from the gang's requeue) until now
                again = final.state_since if worker_id in completed else end
                asked = (PLACED - T0) + (end - PLACED) + (mark - again)
                assert every == round(asked.total_seconds() * GPUS, 3), (worker_id, got)
        assert await run_ledger(db, run.id) == round(sum(every for _, every, _ in got.values()), 3)
        lost = [w for w, end in ends.items() if rows[w].reason == MACHINE_LOST]
        if lost and stop is not None:  # failure, held, from its silence to its loss found
            assert await failure_held(db, lost[0], ms(stop.silent), ends[lost[0]]) == round(
                (ends[lost[0]] - ms(stop.silent)).total_seconds() * GPUS, 3
            )
