"""The Dramatiq broker: Redis in production, in-process (stub broker and a worker thread) when
embedded. Actors are declared on whichever broker is installed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import dramatiq
from dramatiq.asyncio import EventLoopThread, get_event_loop_thread, set_event_loop_thread
from dramatiq.broker import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from backend.config import Settings
from backend.db.commit_jobs import send_jobs_with
from backend.job_names import PASS_JOB
from backend.jobs.actors import BODIES
from backend.jobs.coalescing import Coalescer, LocalFlags, RedisFlags
from backend.jobs.observing import Stats, Timing, depths, exposition, stats_for, warn_if_behind

log = logging.getLogger(__name__)

# Three queues, each with worker threads of its own (see ``start_workers``), so no kind of
# work waits behind another: the clock's work (the goodput tick, lease checks) runs on time
# however slow the scheduling passes are (issue 19: the tick waited 6.5 minutes behind 423
# passes), and the passes, coalesced to one queued at a time, wait behind no webhook.
QUEUE = "astraeus"  # the clock's: accounting.tick, machines.check_leases
SCHEDULING = "astraeus-scheduling"  # scheduling.pass, one queued at most
HOUSEKEEPING = "astraeus-housekeeping"  # webhooks and pruning
QUEUES = [QUEUE, SCHEDULING, HOUSEKEEPING]
_QUEUE_OF = {
    "accounting.tick": QUEUE,
    "machines.check_leases": QUEUE,
    "scheduling.pass": SCHEDULING,
}
PASS = PASS_JOB

_actors: dict[str, dramatiq.Actor[[], None]] = {}
_broker: Broker | None = None
_passes: Coalescer | None = None
_stats: Stats | None = None


def install(settings: Settings, broker: Broker | None = None) -> Broker:
    """Make the broker the settings ask for and declare every actor on it."""
    global _broker, _passes, _stats
    if broker is None:
        broker = RedisBroker(url=settings.redis_url) if settings.broker == "redis" else StubBroker()
    _stats = stats_for(broker)
    broker.add_middleware(SharedLoop())
    broker.add_middleware(Timing(_stats))
    dramatiq.set_broker(broker)
    flags = (
        RedisFlags(broker.client, broker.namespace)
        if isinstance(broker, RedisBroker)
        else LocalFlags()
    )
    _broker, _passes = broker, Coalescer(flags, PASS)
    _actors.clear()
    for name, body in BODIES.items():
        declare = dramatiq.actor(
            actor_name=name,
            queue_name=_QUEUE_OF.get(name, HOUSEKEEPING),
            broker=broker,
            max_retries=3,
            min_backoff=1000,
            max_backoff=30000,
        )
        _actors[name] = declare(_coalesced(body) if name == PASS else body)
    send_jobs_with(send)  # the jobs a transaction asks for, sent once it commits
    return broker


def _coalesced(body: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """The pass's message: runs the pass unless one runs elsewhere (which then goes again)."""

    async def one_pass() -> None:
        if _passes is None:
            await body()
        else:
            await _passes.run(body, _actors[PASS].send)

    one_pass.__name__ = body.__name__
    return one_pass


def send(name: str) -> None:
    """Enqueue an actor's message; call it only after the transaction that needs it committed.

    A scheduling pass folds into the one queued already, if one is."""
    actor = _actors.get(name)
    if actor is None:
        return  # no broker in this process (a CLI command): the periodic pass will do it
    try:
        if name == PASS and _passes is not None:
            if not _passes.ask(actor.send) and _stats is not None:
                _stats.add(name, "folded", 1)
        else:
            actor.send()
    except Exception:  # the broker being down must not fail the request that committed
        log.exception("could not enqueue %s; the periodic pass will catch up", name)


def nudge_scheduler() -> None:
    send(PASS)


def queue_metrics() -> str:
    """Prometheus text: each queue's depth, each actor's run time and wait (all processes'
    on Redis, this one's when embedded)."""
    if _broker is None or _stats is None:
        return ""
    return exposition(depths(_broker, QUEUES), _stats.read())


class SharedLoop(dramatiq.Middleware):
    """Dramatiq's AsyncIO middleware for several workers on one broker: the actors' one event
    loop (the database handle's connections belong to it) started by the first worker to boot
    and stopped by the last to shut down (AsyncIO's own starts one per worker, each replacing
    the last, and the first to stop takes it from the others)."""

    def __init__(self) -> None:
        self._workers = 0
        self._lock = threading.Lock()

    def before_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers += 1
            if self._workers == 1:
                loop = EventLoopThread(log)
                loop.start(timeout=1.0)
                set_event_loop_thread(loop)

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        with self._lock:
            self._workers -= 1
            loop = get_event_loop_thread()
            if self._workers == 0 and loop is not None:
                loop.stop()
                loop.join()
                set_event_loop_thread(None)


# Worker threads per queue: the tick and a lease check may run together; passes run one at a
# time anyway (coalescing.py), so a second thread would only wait on the first one's flag.
CLOCK_THREADS = 2
SCHEDULING_THREADS = 1
# How long a worker's threads wait for a message before they look again, in ms. The in-process
# broker wakes them the moment one is sent: they look again only to see a stop (which waits up
# to twice this long). At 100 ms an idle `astraeus up` spent a sixth of its CPU waking a dozen
# threads ten times a second (2.2 CPU-s a minute; 1.9 at 500 ms). Redis is polled: an idle
# consumer backs off up to this long, so a job sent waits up to it there.
IN_PROCESS_WAIT_MS = 500
REDIS_WAIT_MS = 100


def start_workers(broker: Broker, threads: int) -> list[dramatiq.Worker]:
    """A Dramatiq worker per queue, each with threads of its own, started; ``threads`` for
    the housekeeping queue (webhooks, pruning)."""
    broker.logger.addFilter(_several_workers)
    wait = REDIS_WAIT_MS if isinstance(broker, RedisBroker) else IN_PROCESS_WAIT_MS
    workers = [
        dramatiq.Worker(broker, queues={queue}, worker_threads=n, worker_timeout=wait)
        for queue, n in (
            (QUEUE, CLOCK_THREADS),
            (SCHEDULING, SCHEDULING_THREADS),
            (HOUSEKEEPING, threads),
        )
    ]
    for worker in workers:
        worker.start()
    return workers


def stop_workers(workers: list[dramatiq.Worker]) -> None:
    """Stopped together: each waits for its consumers' last fetch."""
    stopping = [threading.Thread(target=worker.stop) for worker in workers]
    for thread in stopping:
        thread.start()
    for thread in stopping:
        thread.join()


def _several_workers(record: logging.LogRecord) -> bool:
    """Each worker adds a middleware of Dramatiq's own to the broker, and the broker warns of
    the second one alike: expected here, not to worry an operator reading the log."""
    return not (
        isinstance(record.msg, str)
        and record.msg.startswith("You're adding a middleware of the same type twice")
        and "_WorkerMiddleware" in record.getMessage()
    )


@contextlib.asynccontextmanager
async def in_process_worker(
    broker: Broker, threads: int = 1
) -> AsyncIterator[list[dramatiq.Worker]]:
    """Dramatiq workers inside this process (the embedded mode), one per queue."""
    workers = start_workers(broker, threads)
    try:
        yield workers
    finally:
        await asyncio.to_thread(stop_workers, workers)


async def every(interval: float, name: str) -> None:
    """Send ``name`` every ``interval`` seconds: the periodic scheduling pass."""
    while True:
        send(name)
        await asyncio.sleep(interval)


async def every_minute(past: float, name: str) -> None:
    """Send ``name`` at once, then ``past`` seconds after each minute of the wall clock."""
    while True:
        send(name)
        await asyncio.sleep(until_past_minute(time.time(), past))


def until_past_minute(now: float, past: float) -> float:
    """Seconds from ``now`` (epoch) to the next moment ``past`` seconds after a minute."""
    wait = (past - now) % 60.0
    return wait if wait > 0 else 60.0


# The goodput tick, every minute, is sent this long after each minute of the wall clock, not
# when the scheduler happened to start. It counts up to the last whole minute, and a tick sent
# as a minute ends finds that minute's last samples (an agent reports its samples every 5 s)
# still on their way: each that comes late asks for its worker to be counted again from its
# history, the tick's slow path (at 5 000 machines, a tick sent early in the minute left 9 986
# recounts of 5 000 workers behind it). 15 s past the minute, the minute's samples are in,
# unless the server is behind writing them or a machine was away (issue 40).
TICK_PAST_MINUTE_S = 15.0
# Old metric samples grow by the minute; pruning them ten minutes late costs nothing.
PRUNE_INTERVAL_S = 600.0
WEBHOOKS_INTERVAL_S = 2.0  # events reach receivers within about this long
WATCH_INTERVAL_S = 30.0  # queues' depths looked at, a backlog warned about


async def watch(interval: float) -> None:
    """Warn when a queue holds a backlog (the scheduler's log; /metrics says it too)."""
    while True:
        if _broker is not None:
            try:
                warn_if_behind(await asyncio.to_thread(depths, _broker, QUEUES))
            except Exception:
                log.exception("could not read the queues' depths")
        await asyncio.sleep(interval)


async def periodic(settings: Settings) -> None:
    """Every periodic job at its own interval: the scheduling pass and the lease check,
    metrics pruning, the goodput tick every minute, webhook deliveries every two seconds, the
    pruning of ledgers and deliveries past their retention, and the queues' watch."""
    interval = settings.scheduler_interval.total_seconds()
    await asyncio.gather(
        every(interval, "scheduling.pass"),
        every(interval, "machines.check_leases"),
        every(settings.slurm_import_interval.total_seconds(), "slurm.import"),
        every(PRUNE_INTERVAL_S, "metrics.prune"),
        every_minute(TICK_PAST_MINUTE_S, "accounting.tick"),
        every(PRUNE_INTERVAL_S, "accounting.prune"),
        every(PRUNE_INTERVAL_S, "code.prune"),
        every(WEBHOOKS_INTERVAL_S, "webhooks.deliver"),
        every(PRUNE_INTERVAL_S, "webhooks.prune"),
        watch(WATCH_INTERVAL_S),
    )
