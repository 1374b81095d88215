"""Pruning: samples past the retention become one-minute summaries, which are pruned in turn;
the job is a Dramatiq actor sent every ten minutes."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import pytest
from dramatiq import Message
from dramatiq.brokers.stub import StubBroker
from sqlalchemy import select

from backend.config import Settings
from backend.db import Database
from backend.jobs import actors, runtime
from backend.jobs import broker as job_broker
from backend.metrics import service as metrics
from backend.metrics.service import Pruned
from backend.models import MetricMinute, MetricSample
from tests.metrics.conftest import DAY, MINUTE, SECOND, T0, Placed, at, ingest, series
from tests.support import FakeClock, Tenancy
from tests.support.api import query

CPU, RECEIVED, UTIL = (
    "task_cpu_usage_cores",
    "task_network_receive_bytes_total",
    "task_gpu_utilization_ratio",
)


@pytest.fixture
async def old_and_new(db: Database, placed: Placed, clock: FakeClock) -> None:
    """Two minutes of samples at T0, and one sample ten days later; now is T0 + 20 days."""
    await ingest(
        db,
        placed.gpu07,
        series("llama-sft-0", CPU, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 10.0, 10.0])
        + series("llama-sft-0", RECEIVED, [100.0 * i for i in range(1, 13)])
        + series("llama-sft-0", UTIL, [0.5] * 6, gpu=1)
        + series("llama-sft-0", CPU, [7.0], start=T0 + 10 * DAY),
    )
    clock.moment = at(T0 + 20 * DAY + 30 * SECOND)


async def prune(
    db: Database, clock: FakeClock, downsampled: timedelta = timedelta(days=90)
) -> Pruned:
    async with db.transaction() as session:
        return await metrics.prune(
            session, clock.now(), retention=timedelta(days=15), downsampled_retention=downsampled
        )


async def contents(db: Database) -> tuple[list[tuple[int, int, int, float]], ...]:
    """(metric, gpu, ts, value) of the raw samples, then of the minutes."""
    out = []
    async with db.read() as session:
        for model in (MetricSample, MetricMinute):
            rows = await session.execute(
                select(model.metric, model.gpu, model.ts, model.value).order_by(
                    model.metric, model.gpu, model.ts
                )
            )
            out.append([tuple(r) for r in rows])
    return tuple(out)  # type: ignore[return-value]


async def test_old_samples_become_minutes_a_gauges_mean_and_a_counters_last(
    db: Database, clock: FakeClock, old_and_new: None
) -> None:
    assert await prune(db, clock) == Pruned(summarised=5, deleted=26, minutes_deleted=0)
    raw, minutes = await contents(db)
    assert raw == [(1, -1, T0 + 10 * DAY, 7.0)]
    assert minutes == [
        (1, -1, T0, 3.5),
        (1, -1, T0 + MINUTE, 10.0),
        (5, -1, T0, 600.0),
        (5, -1, T0 + MINUTE, 1200.0),
        (7, 1, T0, 0.5),
    ]
    # Run again, at the same time or a minute on: nothing more changes.
    assert await prune(db, clock) == Pruned(0, 0, 0)
    clock.advance(minutes=1)
    assert await prune(db, clock) == Pruned(0, 0, 0)
    assert await contents(db) == (raw, minutes)


async def test_minutes_past_their_own_retention_go_too(
    db: Database, clock: FakeClock, old_and_new: None
) -> None:
    await prune(db, clock)
    clock.moment = at(T0 + 91 * DAY)
    assert await prune(db, clock) == Pruned(summarised=1, deleted=1, minutes_deleted=5)
    assert await contents(db) == ([], [(1, -1, T0 + 10 * DAY, 7.0)])


async def test_with_no_longer_a_downsampled_retention_old_samples_just_go(
    db: Database, clock: FakeClock, old_and_new: None
) -> None:
    assert await prune(db, clock, downsampled=timedelta(0)) == Pruned(0, 26, 0)
    assert await contents(db) == ([(1, -1, T0 + 10 * DAY, 7.0)], [])


async def test_a_range_before_the_retention_reads_the_minutes(
    db: Database, clock: FakeClock, tenancy: Tenancy, old_and_new: None
) -> None:
    await prune(db, clock)
    token = tenancy.member_token
    span = {"start": str(T0), "end": str(T0 + 2 * MINUTE - 1)}
    cpu = await query(db, clock, token, CPU, **span)
    assert cpu["step"] == MINUTE  # never finer than the minutes it reads
    assert cpu["series"] == [{"labels": {}, "points": [[T0, 3.5], [T0 + MINUTE, 10.0]]}]
    rate = await query(db, clock, token, RECEIVED, rate="true", **span)
    assert rate["series"] == [{"labels": {}, "points": [[T0 + MINUTE, 10.0]]}]
    # A range across the cut reads both.
    both = await query(db, clock, token, CPU, start=str(T0), end=str(T0 + 11 * DAY), step="1d")
    assert both["series"] == [{"labels": {}, "points": [[T0, 6.75], [T0 + 10 * DAY, 7.0]]}]


async def test_the_actor_prunes_with_the_settings_and_the_clock(
    db: Database, clock: FakeClock, settings: Settings, old_and_new: None
) -> None:
    runtime.configure(settings, clock)
    try:
        await actors.BODIES["metrics.prune"]()
        await actors.BODIES["metrics.prune"]()  # a redelivered message changes nothing
    finally:
        await runtime.database().dispose()
        runtime.configure(settings)
    raw, minutes = await contents(db)
    assert raw == [(1, -1, T0 + 10 * DAY, 7.0)] and len(minutes) == 5


async def test_the_periodic_jobs_include_pruning(settings: Settings) -> None:
    broker = job_broker.install(settings, StubBroker())
    ticker = asyncio.create_task(job_broker.periodic(settings))
    await asyncio.sleep(0.05)
    ticker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ticker
    sent = {
        queue: sorted(Message.decode(m).actor_name for m in broker.queues[queue].queue)
        for queue in job_broker.QUEUES
    }
    assert sent == {
        job_broker.QUEUE: ["accounting.tick", "machines.check_leases"],
        job_broker.SCHEDULING: ["scheduling.pass"],
        job_broker.HOUSEKEEPING: [
            "accounting.prune",
            "code.prune",
            "metrics.prune",
            "slurm.import",  # one query, nothing more, without a Slurm-backed cluster
            "webhooks.deliver",
            "webhooks.prune",
        ],
    }
    broker.close()
