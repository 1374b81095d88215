"""Scheduling passes coalesce: a burst of asks leaves one pass queued, through the real Redis
broker and the embedded one, and every ask's effect is still done."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import dramatiq
import pytest
from dramatiq import Message
from dramatiq.broker import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from backend.config import Settings
from backend.db import Database
from backend.jobs import broker as job_broker
from backend.jobs import runtime
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy

BURST = 500


@pytest.fixture(params=["redis", "embedded"])
def broker(request: pytest.FixtureRequest, settings: Settings, clock: FakeClock) -> Iterator[Broker]:
    """The real Redis broker in a namespace of its own, or the embedded one; no worker yet."""
    made: Broker = (
        RedisBroker(url="redis://127.0.0.1:6379/0", namespace=f"astraeus-test-{uuid.uuid4().hex}")
        if request.param == "redis"
        else StubBroker()
    )
    job_broker.install(settings, made)
    runtime.configure(settings, clock)
    try:
        yield made
    finally:
        if isinstance(made, RedisBroker):
            made.flush_all()
        made.close()
        runtime.configure(settings)


def queued(broker: Broker, actor: str) -> int:
    """Messages for ``actor`` in any of the broker's queues (delayed ones too), and on Redis
    those a worker has taken and not yet acknowledged."""
    if isinstance(broker, RedisBroker):
        keys = broker.client.keys(f"{broker.namespace}:*.msgs")
        encoded = [m for key in keys for m in broker.client.hvals(key)]
    else:
        assert isinstance(broker, StubBroker)
        encoded = [m for q in broker.queues.values() for m in list(q.queue)]
    return sum(Message.decode(m).actor_name == actor for m in encoded)


def burst(asks: int, threads: int = 4) -> None:
    """``asks`` nudges from ``threads`` threads at once, as requests in several servers."""
    start = threading.Barrier(threads)

    def ask(n: int) -> None:
        start.wait()
        for _ in range(n):
            job_broker.nudge_scheduler()

    pool = [threading.Thread(target=ask, args=(asks // threads,)) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


async def drained(broker: Broker) -> None:
    for queue in broker.get_declared_queues():
        await asyncio.to_thread(broker.join, queue, timeout=30_000)


@pytest.fixture
async def workers(broker: Broker) -> AsyncIterator[list[dramatiq.Worker]]:
    """The production layout: a worker per queue (started by the test when it wants them)."""
    started: list[dramatiq.Worker] = []
    yield started
    await asyncio.to_thread(job_broker.stop_workers, started)


async def test_a_burst_of_asks_leaves_one_pass_queued_and_places_every_run(
    broker: Broker,
    workers: list[dramatiq.Worker],
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(name="first", workers=2, gpus=4)
    await asyncio.to_thread(burst, BURST)
    assert queued(broker, "scheduling.pass") == 1
    workers += job_broker.start_workers(broker, threads=1)
    await drained(broker)
    assert queued(broker, "scheduling.pass") == 0
    assert [w.state for w in await world.workers("first")] == ["Starting", "Starting"]


async def test_asks_while_passes_run_are_all_answered(
    broker: Broker,
    workers: list[dramatiq.Worker],
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
) -> None:
    """Runs submitted among the asks, while passes run: each is placed by a pass after it."""
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=8)
    workers += job_broker.start_workers(broker, threads=1)
    for i in range(8):
        await world.submit(name=f"r{i}", workers=1, gpus=1)
        await asyncio.to_thread(burst, BURST // 8)
        assert queued(broker, "scheduling.pass") <= 2  # one running (not yet acked), one queued
    await drained(broker)
    for i in range(8):
        assert [w.state for w in await world.workers(f"r{i}")] == ["Starting"]
