"""The tick as a Dramatiq actor through the real Redis broker, two worker threads, messages
duplicated: an hour of simulated time gives the ledgers of the pure computation."""

from __future__ import annotations

import asyncio

from dramatiq.brokers.redis import RedisBroker

from backend.accounting import counting
from backend.db import Database
from backend.jobs import broker as job_broker
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.accounting import a_busy_and_an_idle_rank, expected, ledger, sample


async def test_an_hour_of_ticks_through_redis_equals_the_pure_computation(
    redis_worker: RedisBroker,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
) -> None:
    world = World(db, clock, tenancy)
    await a_busy_and_an_idle_rank(world)
    for minute in range(60):
        clock.advance(seconds=60)
        await sample(world, {0: 0.9 if minute % 7 else 0.0, 1: 0.01})
        for _ in range(3):  # a retried, a duplicated and a concurrent tick every minute
            job_broker.send("accounting.tick")
        # (polled every 10 ms, not join's 100: sixty joins a test)
        await asyncio.to_thread(redis_worker.join, job_broker.QUEUE, interval=10, timeout=30_000)
    until = counting.minute_floor(clock.now())
    assert await ledger(world) == await expected(world, until)
    assert sum((await ledger(world)).values()) > 2 * 8 * 3500
