"""A Dramatiq worker on Redis for the tests of the jobs through the broker, and the check
that no test leaves a worker's threads running."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq.asyncio import EventLoopThread
from dramatiq.brokers.redis import RedisBroker
from dramatiq.worker import ConsumerThread, WorkerThread

from backend.config import Settings
from backend.jobs import broker as job_broker
from backend.jobs import runtime
from tests.support import FakeClock


def job_threads() -> set[threading.Thread]:
    """This process's Dramatiq threads: workers' consumers and worker threads, and the event
    loop the actors run in."""
    kinds = (ConsumerThread, WorkerThread, EventLoopThread)
    return {thread for thread in threading.enumerate() if isinstance(thread, kinds)}


@pytest.fixture(autouse=True)
def no_job_threads_left() -> Iterator[None]:
    """Every test stops the workers it started. Issue 39: tests/jobs/test_coalescing.py's
    stopped none, and their threads ran on into the lane's later tests (a property test there
    was warned of `random` used inside its strategies)."""
    before = job_threads()
    yield
    left = sorted(thread.name for thread in job_threads() - before)
    assert not left, f"the test left Dramatiq's threads running: {', '.join(left)}"


@pytest.fixture
def redis_worker(settings: Settings, clock: FakeClock) -> Iterator[RedisBroker]:
    """A Redis broker in a namespace of its own, and a worker with two threads consuming it."""
    broker = RedisBroker(
        url="redis://127.0.0.1:6379/0", namespace=f"astraeus-test-{uuid.uuid4().hex}"
    )
    job_broker.install(settings, broker)
    runtime.configure(settings, clock)
    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        yield broker
    finally:
        worker.stop()
        broker.flush_all()
        broker.close()
        runtime.configure(settings)
