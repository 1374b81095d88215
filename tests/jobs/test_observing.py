"""What an operator sees of the job queues: GET /metrics (depth, run time, wait, folded asks)
and the backlog warnings, on the embedded broker the app installs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import dramatiq
import httpx
import pytest
from dramatiq import Message
from starlette.applications import Starlette

from backend.config import Settings
from backend.jobs import broker as job_broker
from backend.jobs import observing, runtime
from tests.support import FakeClock, Tenancy


async def scrape(client: httpx.AsyncClient, token: str) -> httpx.Response:
    return await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})


async def test_metrics_show_the_folded_asks_the_depth_and_each_run(
    app: Starlette,
    client: httpx.AsyncClient,
    tenancy: Tenancy,
    settings: Settings,
    clock: FakeClock,
) -> None:
    broker = dramatiq.get_broker()
    for _ in range(5):
        job_broker.nudge_scheduler()
    found = await scrape(client, tenancy.admin_token)
    assert found.status_code == 200
    assert found.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = found.text.splitlines()
    assert 'astraeus_jobs_queued{queue="astraeus-scheduling"} 1' in lines
    assert 'astraeus_jobs_queued{queue="astraeus"} 0' in lines
    assert 'astraeus_job_folded_total{actor="scheduling.pass"} 4' in lines
    runtime.configure(settings, clock)
    workers = job_broker.start_workers(broker, threads=1)
    try:
        await asyncio.to_thread(broker.join, job_broker.SCHEDULING, timeout=30_000)
    finally:
        await asyncio.to_thread(job_broker.stop_workers, workers)
        await runtime.database().dispose()
        runtime.configure(settings)
    lines = (await scrape(client, tenancy.admin_token)).text.splitlines()
    assert 'astraeus_jobs_queued{queue="astraeus-scheduling"} 0' in lines
    assert 'astraeus_job_duration_seconds_count{actor="scheduling.pass"} 1' in lines
    took = next(x for x in lines if x.startswith('astraeus_job_duration_seconds_sum{actor="sch'))
    assert float(took.split()[-1]) > 0


async def test_metrics_are_for_organisation_admins(
    app: Starlette, client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    refused = await scrape(client, tenancy.member_token)
    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"
    assert (await client.get("/metrics")).status_code == 401


async def test_a_message_that_waited_long_is_warned_about(
    app: Starlette, settings: Settings, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    broker = dramatiq.get_broker()
    late = int((time.time() - 90) * 1000)
    broker.enqueue(Message(job_broker.QUEUE, "accounting.tick", (), {}, {}, message_timestamp=late))
    runtime.configure(settings, clock)
    workers = job_broker.start_workers(broker, threads=1)
    try:
        with caplog.at_level(logging.WARNING, logger=observing.__name__):
            await asyncio.to_thread(broker.join, job_broker.QUEUE, timeout=30_000)
    finally:
        await asyncio.to_thread(job_broker.stop_workers, workers)
        await runtime.database().dispose()
        runtime.configure(settings)
    assert any(
        "accounting.tick waited 9" in r.getMessage() and "backlog" in r.getMessage()
        for r in caplog.records
    )


async def test_a_deep_queue_is_warned_about(
    app: Starlette, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(observing.DEPTH_WARNING):
        job_broker.send("webhooks.prune")
    with caplog.at_level(logging.WARNING, logger=observing.__name__):
        watching = asyncio.create_task(job_broker.watch(60))
        await asyncio.sleep(0.2)
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    assert [r.getMessage() for r in caplog.records] == [
        f"queue astraeus-housekeeping holds {observing.DEPTH_WARNING} messages: "
        "the workers are behind (a backlog)"
    ]
