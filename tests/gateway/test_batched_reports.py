"""Many machines' progress reports and samples written together (issue 19, the fleet): a few
statements for them all, each worker moved exactly as the lifecycle's own path moves it, a
report that ends a stall left to that path, and rows another transaction holds never waited
for (left to be written alone)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from astraeus.agent.v1 import agent_pb2
from sqlalchemy import select, update

from backend.db import Database
from backend.gateway import service
from backend.gateway.handlers import MessageHandlers
from backend.gateway.service import ProgressInfo
from backend.metrics import service as metrics
from backend.metrics.rules import SampleIn
from backend.models import Checkpoint, Machine, MetricSample, StateTransition, Worker
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.stream import statements

FIELDS = ("state", "phase", "progress_at", "progress_step", "stepped_at", "progress_rate")


@pytest.fixture
async def world(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    world = World(db, clock, tenancy)
    for i in range(4):
        await world.machine(f"gpu-{i}", gpus=8)
    return world


async def running(world: World, name: str, workers: int, gpus: int = 2) -> list[Worker]:
    await world.submit(name=name, workers=workers, gpus=gpus, stall_timeout="5m", on_stall="keep")
    await world.schedule()
    await world.start(*(f"{name}-{i}" for i in range(workers)))
    return await world.workers(name)


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


async def batched(
    world: World,
    progress: list[ProgressInfo],
    samples: list[tuple[int, list[SampleIn]]] | None = None,
) -> service.Leftovers:
    async with world.db.transaction() as session:
        return await service.reports(session, world.clock, progress, samples or [])


def fields(workers: list[Worker]) -> list[tuple[Any, ...]]:
    return [(*(getattr(w, f) for f in FIELDS), w.stalled_since) for w in workers]


async def transitions(world: World, run: str) -> list[tuple[int, str]]:
    async with world.db.read() as session:
        rows = await session.execute(
            select(Worker.rank, StateTransition.state)
            .join(Worker, Worker.id == StateTransition.worker_id)
            .where(Worker.name.startswith(run))
            .order_by(StateTransition.id)
        )
        return [(rank, state) for rank, state in rows]


async def test_batched_progress_moves_each_worker_as_the_lifecycle_does(world: World) -> None:
    alone = await running(world, "alone", 3)
    together = await running(world, "together", 3)
    for t in range(1, 6):
        now = world.clock.advance(seconds=10)
        reports = []
        for i, (a, b) in enumerate(zip(alone, together, strict=True)):
            step = t * (i + 1) * 10
            await world.report(a.name, "progress", step=step, at=now)
            assert b.machine_id is not None
            reports.append(ProgressInfo(b.machine_id, b.id, b.attempt, step, now))
        # changing nothing: another attempt's report, another machine's, output without a
        # step from a workload that reports its steps
        b = together[0]
        assert b.machine_id is not None
        reports += [
            ProgressInfo(b.machine_id, b.id, b.attempt + 7, 10_000, now),
            ProgressInfo(b.machine_id + 100, b.id, b.attempt, 10_000, now),
            ProgressInfo(b.machine_id, b.id, b.attempt, None, now + timedelta(seconds=5)),
        ]
        await world.report(alone[0].name, "progress", at=now + timedelta(seconds=5))
        assert await batched(world, reports) == service.Leftovers()
    moved_alone, moved_together = await world.workers("alone"), await world.workers("together")
    assert fields(moved_together) == fields(moved_alone)
    assert moved_together[2].progress_step == 150
    assert moved_together[2].progress_rate == pytest.approx(3.0)
    assert await transitions(world, "together") == await transitions(world, "alone")


async def test_a_report_that_ends_a_stall_is_left_to_the_lifecycle(world: World) -> None:
    alone = await running(world, "alone", 2)
    together = await running(world, "together", 2)
    world.clock.advance(minutes=6)
    await world.timers()
    assert all(w.stalled_since is not None for w in await world.workers("together"))
    now = world.clock.advance(seconds=1)
    reports = []
    for a, b in zip(alone, together, strict=True):
        await world.report(a.name, "progress", step=1, at=now)
        assert b.machine_id is not None
        reports.append(ProgressInfo(b.machine_id, b.id, b.attempt, 1, now))
    left = await batched(world, reports)
    assert left.progress == [0, 1]
    assert all(w.stalled_since is not None for w in await world.workers("together"))
    for p in reports:  # written alone, as the stream's writer does with what was left
        async with world.db.transaction() as session:
            await service.progress(
                session, world.clock, p.machine_id, p.worker_id, p.attempt, p.step, p.at
            )
    assert fields(await world.workers("together")) == fields(await world.workers("alone"))
    assert await transitions(world, "together") == await transitions(world, "alone")


async def test_a_worker_held_by_another_transaction_is_not_waited_for(
    world: World, db: Database
) -> None:
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer: no row is held by another")
    held, free = await running(world, "pair", 2)
    assert held.machine_id is not None and free.machine_id is not None
    now = world.clock.advance(seconds=10)
    reports = [
        ProgressInfo(held.machine_id, held.id, held.attempt, 5, now),
        ProgressInfo(free.machine_id, free.id, free.attempt, 5, now),
    ]
    samples = [
        (
            w.machine_id,
            [
                SampleIn(w.id, "task_gpu_utilization_ratio", g, ms(now), 0.5, w.attempt)
                for g in w.gpu_ids
            ],
        )
        for w in (held, free)
        if w.machine_id is not None
    ]
    async with db.transaction() as holder:  # a scheduling pass, a gang's change
        await holder.execute(
            update(Worker).where(Worker.id == held.id).values(reason=Worker.reason)
        )
        began = time.monotonic()
        left = await asyncio.wait_for(batched(world, reports, samples), 10)
        assert time.monotonic() - began < 5
    assert left.progress == [0]
    assert left.utilization == {(held.machine_id, held.id): 0.5}
    held_now, free_now = await world.workers("pair")
    assert (held_now.progress_step, held_now.gpu_utilization) == (None, None)
    assert (free_now.progress_step, free_now.gpu_utilization) == (5, 0.5)
    async with db.read() as session:  # every sample is stored, the held worker's too
        count = len(list(await session.scalars(select(MetricSample.worker_id))))
    assert count == len(held.gpu_ids) + len(free.gpu_ids)
    async with db.transaction() as session:
        await service.record_gpu_utilizations(session, left.utilization)
    assert (await world.workers("pair"))[0].gpu_utilization == 0.5


async def test_many_machines_samples_are_stored_together_counted_by_machine(
    world: World, db: Database
) -> None:
    workers = await running(world, "wide", 4, gpus=8)  # a machine each
    now = world.clock.advance(seconds=10)
    by_machine: dict[int, list[SampleIn]] = {}
    for w in workers:
        assert w.machine_id is not None
        by_machine.setdefault(w.machine_id, []).extend(
            SampleIn(w.id, "task_gpu_utilization_ratio", g, ms(now), 0.25, w.attempt)
            for g in w.gpu_ids
        )
    first, *rest = sorted(by_machine)
    async with db.transaction() as session:
        stored = await metrics.ingest_many(session, [(first, by_machine[first])])
    assert stored == {first: len(by_machine[first])}
    # the first machine's batch again (resent after a reconnect) beside the others' new ones,
    # and a sample of a worker placed elsewhere (dropped)
    stray = SampleIn(workers[-1].id, "task_gpu_utilization_ratio", 0, ms(now) + 1, 0.9, None)
    batches = [(first, [*by_machine[first], stray])] + [(m, by_machine[m]) for m in rest]
    async with db.transaction() as session:
        stored = await metrics.ingest_many(session, batches)
    assert stored.get(first, 0) == 0
    assert {m: stored[m] for m in rest} == {m: len(by_machine[m]) for m in rest}
    async with db.read() as session:
        count = len(list(await session.scalars(select(MetricSample.worker_id))))
    assert count == sum(len(s) for s in by_machine.values())


async def test_a_batch_of_many_reports_is_a_few_statements(world: World, db: Database) -> None:
    workers = await running(world, "wide", 16)
    now = world.clock.advance(seconds=10)
    reports = []
    by_machine: dict[int, list[SampleIn]] = {}
    for w in workers:
        assert w.machine_id is not None
        reports.append(ProgressInfo(w.machine_id, w.id, w.attempt, 3, now))
        by_machine.setdefault(w.machine_id, []).extend(
            SampleIn(w.id, "task_gpu_utilization_ratio", g, ms(now), 0.7, w.attempt)
            for g in w.gpu_ids
        )
    with statements(db) as seen:
        left = await batched(world, reports, list(by_machine.items()))
    assert left == service.Leftovers()
    # the locks, the progress, the placements, the samples (a COPY in a savepoint on
    # PostgreSQL, an insert per machine on SQLite), the utilisation: not a few per report
    most = 8 if db.engine.dialect.name == "postgresql" else 5 + 3 * len(by_machine)
    assert len(seen) <= most, seen
    assert {w.progress_step for w in await world.workers("wide")} == {3}
    assert {w.gpu_utilization for w in await world.workers("wide")} == {0.7}


def test_a_forged_agents_step_past_the_columns_range_is_no_step() -> None:
    # uint64 on the wire, a signed 64-bit column behind: a (forged) agent's 2**64 - 1 is
    # progress without a step or checkpoint, never a write that fails its batch
    handlers = MessageHandlers.__new__(MessageHandlers)  # progress_info reads the clock alone
    handlers.clock = FakeClock(datetime.fromisoformat("2026-10-01T00:00:00+00:00"))
    machine = Machine(id=7, name="gpu-07")
    huge = agent_pb2.AgentMessage(
        progress=agent_pb2.Progress(worker_id=3, step=2**64 - 1, checkpoint_step=2**63)
    )
    found = handlers.progress_info(machine, huge)
    assert (found.step, found.checkpoint_step) == (None, None)
    kept = agent_pb2.AgentMessage(
        progress=agent_pb2.Progress(worker_id=3, step=2**63 - 1, checkpoint_step=400)
    )
    found = handlers.progress_info(machine, kept)
    assert (found.step, found.checkpoint_step) == (2**63 - 1, 400)


async def test_a_checkpoint_in_a_batch_is_kept_there_with_its_cost(world: World) -> None:
    # issue 41: a running worker's new checkpoint is written with the batch (not left to the
    # lifecycle's whole path: a workload that names a new one in every report would send each
    # of its reports there), its cost the pause in its steps: 25 s for 10 steps at 1 a second
    (w,) = await running(world, "ckpt", 1)
    assert w.machine_id is not None
    start = world.clock.now()
    reports = [
        ProgressInfo(w.machine_id, w.id, w.attempt, 0, start + timedelta(seconds=1)),
        ProgressInfo(w.machine_id, w.id, w.attempt, 10, start + timedelta(seconds=11)),
        ProgressInfo(w.machine_id, w.id, w.attempt, 20, start + timedelta(seconds=36), 20),
        ProgressInfo(w.machine_id, w.id, w.attempt, 25, start + timedelta(seconds=41), 20),
    ]
    assert (await batched(world, reports)).progress == []
    async with world.db.read() as session:
        kept = [
            (c.run_id, c.worker_id, c.step, c.at, c.cost_s)
            for c in await session.scalars(select(Checkpoint))
        ]
        (row,) = await session.scalars(select(Worker).where(Worker.id == w.id))
    assert kept == [(w.run_id, w.id, 20, start + timedelta(seconds=36), 15.0)]
    assert (row.checkpoint_step, row.progress_rate) == (20, 1.0)  # the pause is not its pace
