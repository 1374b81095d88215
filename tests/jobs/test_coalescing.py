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
from redis import Redis
from sqlalchemy import select

from backend.config import Settings
from backend.db import Database
from backend.jobs import broker as job_broker
from backend.jobs import runtime
from backend.jobs.coalescing import QUEUED_TTL_S, Coalescer, LocalFlags, RedisFlags
from backend.machines import service as machines
from backend.models import LeaseCheck
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy

BURST = 500


@pytest.fixture(params=["redis", "embedded"])
def broker(
    request: pytest.FixtureRequest, settings: Settings, clock: FakeClock
) -> Iterator[Broker]:
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
    encoded: list[bytes]
    if isinstance(broker, RedisBroker):
        keys = broker.client.keys(f"{broker.namespace}:*.msgs")
        encoded = [m for key in keys for m in broker.client.hvals(key) if isinstance(m, bytes)]
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
    """The production layout: a worker per queue (started by the test when it wants them).

    Stopped in ``finally``: the ``db`` fixture's teardown closes the loop's async generators,
    this one with them (it was set up first), and a stop after a bare ``yield`` never ran:
    every test left its workers' threads running, in the lane's later tests."""
    started: list[dramatiq.Worker] = []
    try:
        yield started
    finally:
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


class Pass:
    """A pass body that waits to be let go, counting its runs."""

    def __init__(self) -> None:
        self.runs = 0
        self.started = asyncio.Event()
        self.go = asyncio.Event()

    async def __call__(self) -> None:
        self.runs += 1
        self.started.set()
        await self.go.wait()


@pytest.fixture(params=["redis", "embedded"])
def two_processes(request: pytest.FixtureRequest) -> Iterator[tuple[Coalescer, Coalescer]]:
    """Two processes' coalescers over the same flags: two Redis clients, or one process's."""
    if request.param == "embedded":
        flags = LocalFlags()
        yield Coalescer(flags, "pass"), Coalescer(flags, "pass")
        return
    namespace = f"astraeus-test-{uuid.uuid4().hex}"
    clients = [Redis.from_url("redis://127.0.0.1:6379/0") for _ in range(2)]
    try:
        yield (
            Coalescer(RedisFlags(clients[0], namespace), "pass"),
            Coalescer(RedisFlags(clients[1], namespace), "pass"),
        )
    finally:
        keys = clients[0].keys(f"{namespace}:*")
        if keys:
            clients[0].delete(*keys)
        for client in clients:
            client.close()


async def test_an_ask_during_a_pass_runs_one_more_pass_after_it(
    two_processes: tuple[Coalescer, Coalescer],
) -> None:
    one, other = two_processes
    queue: list[str] = []
    body = Pass()
    assert one.ask(lambda: queue.append("m1"))
    assert not other.ask(lambda: queue.append("never"))  # folded into m1
    running = asyncio.create_task(one.run(body, lambda: queue.append("again")))
    await body.started.wait()
    # Asked during the pass: the pass read the database before this change, so one more.
    assert other.ask(lambda: queue.append("m2"))
    assert not one.ask(lambda: queue.append("never"))
    # m2 taken by the other process while the first pass runs: it leaves it to that pass.
    assert not await other.run(body, lambda: queue.append("never"))
    body.go.set()
    assert await running
    assert body.runs == 2 and queue == ["m1", "m2"]
    # Nothing more is owed: the next ask queues, and its message runs here.
    assert one.ask(lambda: queue.append("m3"))
    assert await other.run(body, lambda: queue.append("never"))
    assert body.runs == 3 and queue == ["m1", "m2", "m3"]


async def test_an_ask_during_a_pass_taken_after_it_runs_on_its_own(
    two_processes: tuple[Coalescer, Coalescer],
) -> None:
    one, other = two_processes
    queue: list[str] = []
    body = Pass()
    one.ask(lambda: queue.append("m1"))
    running = asyncio.create_task(one.run(body, lambda: queue.append("never")))
    await body.started.wait()
    assert other.ask(lambda: queue.append("m2"))
    body.go.set()
    await running
    assert body.runs == 1
    assert await other.run(body, lambda: queue.append("never"))
    assert body.runs == 2 and queue == ["m1", "m2"]


async def test_a_message_that_could_not_be_sent_is_not_counted_queued() -> None:
    coalescer = Coalescer(LocalFlags(), "pass")

    def broker_down() -> None:
        raise ConnectionError("no broker")

    with pytest.raises(ConnectionError):
        coalescer.ask(broker_down)
    sent: list[str] = []
    assert coalescer.ask(lambda: sent.append("m1")) and sent == ["m1"]


def test_a_lost_message_stops_folding_once_its_flag_expires() -> None:
    now = [0.0]
    coalescer = Coalescer(LocalFlags(now=lambda: now[0]), "pass")
    assert coalescer.ask(lambda: None)
    assert not coalescer.ask(lambda: None)
    now[0] += QUEUED_TTL_S
    assert coalescer.ask(lambda: None)


async def test_the_tick_runs_on_time_while_passes_are_slow(
    broker: Broker,
    workers: list[dramatiq.Worker],
    db: Database,
    clock: FakeClock,
    settings: Settings,
) -> None:
    """Passes held up (the lease check's row locked by another transaction, as a slow pass
    would be): a burst of asks, then the tick, which runs while the pass still waits."""
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's one writer would hold the tick up with the pass")
    async with db.transaction() as session:
        await machines.expire_leases(session, clock, settings.lease_time)
    async with db.transaction() as session:
        await session.execute(select(LeaseCheck).with_for_update())
        await asyncio.to_thread(burst, BURST)
        job_broker.send("accounting.tick")
        workers += job_broker.start_workers(broker, threads=1)
        ran = await ran_within(30.0, "accounting.tick")
        assert ran == 1
        assert ran_count("scheduling.pass") == 0  # the pass still waits for the lock
        assert 'astraeus_jobs_queued{queue="astraeus-scheduling"} 0' in job_broker.queue_metrics()
    await drained(broker)
    assert ran_count("scheduling.pass") == 1


def ran_count(actor: str) -> int:
    """How many of ``actor``'s messages ran, as /metrics says."""
    prefix = f'astraeus_job_duration_seconds_count{{actor="{actor}"}} '
    lines = [line for line in job_broker.queue_metrics().splitlines() if line.startswith(prefix)]
    return int(lines[0].removeprefix(prefix)) if lines else 0


async def ran_within(seconds: float, actor: str) -> int:
    for _ in range(int(seconds * 10)):
        if ran_count(actor):
            break
        await asyncio.sleep(0.1)
    return ran_count(actor)
