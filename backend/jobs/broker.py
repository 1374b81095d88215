"""The Dramatiq broker: Redis in production, in-process (stub broker and a worker thread) when
embedded. Actors are declared on whichever broker is installed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import dramatiq
from dramatiq.broker import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware.asyncio import AsyncIO

from backend.config import Settings
from backend.jobs.actors import BODIES

log = logging.getLogger(__name__)
QUEUE = "astraeus"

_actors: dict[str, dramatiq.Actor[[], None]] = {}


def install(settings: Settings, broker: Broker | None = None) -> Broker:
    """Make the broker the settings ask for and declare every actor on it."""
    if broker is None:
        broker = RedisBroker(url=settings.redis_url) if settings.broker == "redis" else StubBroker()
    broker.add_middleware(AsyncIO())
    dramatiq.set_broker(broker)
    _actors.clear()
    for name, body in BODIES.items():
        declare = dramatiq.actor(
            actor_name=name,
            queue_name=QUEUE,
            broker=broker,
            max_retries=3,
            min_backoff=1000,
            max_backoff=30000,
        )
        _actors[name] = declare(body)
    return broker


def send(name: str) -> None:
    """Enqueue an actor's message; call it only after the transaction that needs it committed."""
    actor = _actors.get(name)
    if actor is None:
        return  # no broker in this process (a CLI command): the periodic pass will do it
    try:
        actor.send()
    except Exception:  # the broker being down must not fail the request that committed
        log.exception("could not enqueue %s; the periodic pass will catch up", name)


def nudge_scheduler() -> None:
    send("scheduling.pass")


@contextlib.asynccontextmanager
async def in_process_worker(broker: Broker, threads: int = 1) -> AsyncIterator[dramatiq.Worker]:
    """A Dramatiq worker inside this process (the embedded mode)."""
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=100)
    worker.start()
    try:
        yield worker
    finally:
        await asyncio.to_thread(worker.stop)


async def every(interval: float, name: str) -> None:
    """Send ``name`` every ``interval`` seconds: the periodic scheduling pass."""
    while True:
        send(name)
        await asyncio.sleep(interval)


# Old metric samples grow by the minute; pruning them ten minutes late costs nothing.
TICK_INTERVAL_S = 60.0  # the goodput tick: every minute, counting whole minutes
PRUNE_INTERVAL_S = 600.0
WEBHOOKS_INTERVAL_S = 2.0  # events reach receivers within about this long


async def periodic(settings: Settings) -> None:
    """Every periodic job at its own interval: the scheduling pass, metrics pruning, the
    goodput tick every minute, webhook deliveries every two seconds, and the pruning of
    ledgers and deliveries past their retention."""
    await asyncio.gather(
        every(settings.scheduler_interval.total_seconds(), "scheduling.pass"),
        every(PRUNE_INTERVAL_S, "metrics.prune"),
        every(TICK_INTERVAL_S, "accounting.tick"),
        every(PRUNE_INTERVAL_S, "accounting.prune"),
        every(WEBHOOKS_INTERVAL_S, "webhooks.deliver"),
        every(PRUNE_INTERVAL_S, "webhooks.prune"),
    )
