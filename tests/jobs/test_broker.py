"""The embedded mode's workers: started one per queue, and stopped with every thread they
started (issue 39: threads left running ran on into the tests after)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from dramatiq.broker import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from backend.config import Settings
from backend.jobs import broker as job_broker
from tests.support.jobs import job_threads


@pytest.fixture(params=["redis", "embedded"])
def broker(request: pytest.FixtureRequest, settings: Settings) -> Iterator[Broker]:
    made: Broker = (
        RedisBroker(url="redis://127.0.0.1:6379/0", namespace=f"astraeus-test-{uuid.uuid4().hex}")
        if request.param == "redis"
        else StubBroker()
    )
    job_broker.install(settings, made)
    try:
        yield made
    finally:
        if isinstance(made, RedisBroker):
            made.flush_all()
        made.close()


def test_stopped_workers_leave_none_of_their_threads(broker: Broker) -> None:
    before = job_threads()
    workers = job_broker.start_workers(broker, threads=2)
    started = job_threads() - before
    # per queue a consumer and a delay queue's consumer; 2 + 1 + 2 worker threads; one loop
    assert len(started) == 3 * 2 + 2 + 1 + 2 + 1
    job_broker.stop_workers(workers)
    assert not [thread.name for thread in started if thread.is_alive()]


@pytest.mark.parametrize(
    ("now", "wait"),
    [
        (1_800_000_000.0, 15.0),  # on a minute: its 15th second
        (1_800_000_014.5, 0.5),
        (1_800_000_015.0, 60.0),  # sent now: the next minute's
        (1_800_000_016.0, 59.0),
        (1_800_000_059.9, 15.1),
    ],
)
def test_the_tick_is_sent_past_each_minute_of_the_wall_clock(now: float, wait: float) -> None:
    # issue 40: whenever the scheduler started, the tick comes 15 s past a minute, when that
    # minute's samples are in (1 800 000 000 is a whole minute of the epoch)
    assert job_broker.TICK_PAST_MINUTE_S == 15.0
    assert job_broker.until_past_minute(now, job_broker.TICK_PAST_MINUTE_S) == pytest.approx(wait)
