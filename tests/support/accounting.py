"""Helpers of the accounting tests: a tick, a minute's samples, the ledgers expected."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from backend.accounting import counting, interval_queries, rules
from backend.accounting.rules import Ledger, PhaseChange
from backend.gateway import service as agents
from backend.metrics.rules import SampleIn
from backend.models import GoodputHour, MetricSample, StateTransition, Worker
from tests.lifecycle.world import World
from tests.support import SEED_TIME

T0 = SEED_TIME


async def tick(world: World) -> counting.TickResult:
    async with world.db.transaction() as session:
        return await counting.tick(session, world.clock)


async def counted_until(world: World) -> datetime:
    """The goodput mark: every second before it is counted."""
    async with world.db.read() as session:
        mark = await session.scalar(text("SELECT counted_until FROM accounting_marks"))
    assert mark is not None
    found = mark if isinstance(mark, datetime) else datetime.fromisoformat(mark)
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)  # SQLite's


async def run_gpu_seconds(world: World, run_id: int) -> float:
    """Every GPU-second the run's ledger holds, all categories together."""
    async with world.db.read() as session:
        total = await session.scalar(
            text(
                "SELECT coalesce(sum(gpu_seconds), 0) FROM goodput_hours "
                "WHERE scope = 'run' AND scope_id = :id"
            ),
            {"id": run_id},
        )
    return float(total or 0)


async def ledger(world: World, scope: str = "run") -> dict[tuple[str, bool], float]:
    async with world.db.read() as session:
        rows = await session.scalars(select(GoodputHour).where(GoodputHour.scope == scope))
        out: dict[tuple[str, bool], float] = defaultdict(float)
        for r in rows:
            out[(r.category, r.held)] += r.gpu_seconds
    return {k: round(v, 3) for k, v in out.items() if round(v, 3)}


async def all_intervals(world: World) -> list[interval_queries.IntervalRow]:
    """Every interval written, closed or open, earliest first."""
    async with world.db.read() as session:
        return await interval_queries.intervals_of(
            session,
            start=T0 - timedelta(days=1),
            end=T0 + timedelta(days=800),
            workspace_ids=None,
            limit=1_000_000,
        )


async def expected(world: World, until: datetime) -> dict[tuple[str, bool], float]:
    """The pure computation over everything recorded: every worker from its submission."""
    async with world.db.read() as session:
        transitions = list(
            await session.scalars(
                select(StateTransition).where(StateTransition.worker_id.is_not(None))
            )
        )
        samples = list(await session.scalars(select(MetricSample)))
    changes: dict[int, list[PhaseChange]] = defaultdict(list)
    for t in sorted(transitions, key=lambda t: (t.transition_at, t.id)):
        if t.phase is None:
            continue
        same = changes[t.worker_id]  # type: ignore[index]
        change = PhaseChange(t.transition_at, t.phase, t.gpus, t.machine_id)
        if same and same[-1].at == change.at:
            same[-1] = change
        else:
            same.append(change)
    per_minute: dict[tuple[int, int], list[float]] = defaultdict(list)
    for s in samples:
        per_minute[(s.worker_id, s.ts // 60_000 * 60_000)].append(s.value)
    parts = []
    for worker_id, worker_changes in changes.items():

        def utilisation(minute: datetime, _: datetime, w: int = worker_id) -> float | None:
            values = per_minute.get((w, int(minute.timestamp()) * 1000))
            return sum(values) / len(values) if values else None

        parts += rules.intervals(worker_changes, T0, until, utilisation)
    totals = Ledger.of(parts)
    out = {(c.value, True): round(v, 3) for c, v in totals.held.items() if round(v, 3)}
    out |= {(c.value, False): round(v, 3) for c, v in totals.not_held.items() if round(v, 3)}
    return out


async def sample(world: World, busy: dict[int, float] | dict[str, float]) -> None:
    """Each running worker's GPUs' utilisation now, as its agent would send it; ``busy`` by
    rank, or by worker name (a worker not named: 0)."""
    await sample_minutes(world, busy, 0)


async def sample_minutes(
    world: World, busy: dict[int, float] | dict[str, float], minutes: int
) -> None:
    """``minutes`` minutes pass, each running worker's GPUs sampled at the end of each (now
    only, for none), and the samples sent as one batch per machine, as an agent sends what it
    sampled since its last batch: one transaction, however many minutes."""
    async with world.db.transaction() as session:
        workers = list(await session.scalars(select(Worker).where(Worker.state == "Running")))
        batches: dict[int, list[SampleIn]] = defaultdict(list)
        for _ in range(max(minutes, 1)):
            if minutes:
                world.clock.advance(minutes=1)
            at_ms = int(world.clock.now().timestamp() * 1000)
            for w in workers:
                assert w.machine_id is not None
                value = busy.get(w.name, busy.get(w.rank, 0.0))  # type: ignore[call-overload]
                batches[w.machine_id] += [
                    SampleIn(w.id, "task_gpu_utilization_ratio", gpu, at_ms, value)
                    for gpu in w.gpu_ids
                ]
        for machine_id, samples in batches.items():
            await agents.metrics(session, machine_id, samples, world.clock)


async def a_busy_and_an_idle_rank(world: World) -> None:
    """llama-sft: rank 0 busy, rank 1 idle, 8 GPUs each, for ten minutes, then stopped."""
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(gpus=8)
    world.clock.advance(seconds=37)
    await world.schedule()
    world.clock.advance(seconds=5)
    await world.start("llama-sft-0", "llama-sft-1")


@pytest.fixture
async def week(world: World) -> World:
    """Two runs of the seed's table: llm (8 GPUs) and sweep-7 (4 GPUs, which waited ten
    minutes for its first placement), both busy, 50 minutes sampled each minute and counted
    each ten (the ledgers are the same however often the tick runs: test_tick.py)."""
    await world.machine("gpu-07")
    await world.submit(name="llm", workers=1, gpus=8)
    await world.schedule()
    await world.start("llm-0")
    await world.submit(name="sweep-7", workers=1, gpus=4)  # no room yet: it waits
    world.clock.advance(minutes=10)
    await world.machine("gpu-08")
    await world.schedule()
    await world.start("sweep-7-0")
    for _ in range(5):
        await sample_minutes(world, {0: 0.95}, 10)  # each run's one worker is its rank 0
        await tick(world)
    return world
