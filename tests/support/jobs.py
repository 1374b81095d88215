"""A Dramatiq worker on Redis for the tests of the jobs through the broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from backend.config import Settings
from backend.jobs import broker as job_broker
from backend.jobs import runtime
from tests.support import FakeClock


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
