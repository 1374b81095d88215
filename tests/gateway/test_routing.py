"""Log requests reach the replica holding the machine's stream: two replicas (an
AgentService and a RedisRouter each) sharing the real Redis, a real agent connected to one,
a real worker printing; and the embedded router, without Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from sqlalchemy import select
from starlette.applications import Starlette

from agent.backoff import Backoff
from backend.app import create_app
from backend.config import Settings
from backend.db import Database
from backend.gateway import redis_router, routing
from backend.gateway.follow_buffer import LogChunkInfo
from backend.gateway.redis_router import RedisRouter
from backend.gateway.servicer import AgentService, serve
from backend.jobs import broker as job_broker
from backend.logs.service import LogUnavailable, WorkerRef
from backend.models import Machine, Worker
from tests.e2e.services import PrivateRedis
from tests.lifecycle.world import World
from tests.support import WORKLOAD_PYTHON, FakeClock, Tenancy
from tests.support.agents import agent_for, stop_serving, wait_for, worker_state
from tests.support.api import auth
from tests.support.stream import _port

REDIS_URL = "redis://127.0.0.1:6379/0"
MAX_BYTES = 900 * 1024
# A worker no database holds: for routers spoken to by hand (the machine knows it by id).
LLAMA = WorkerRef(41, "llama-sft-0")


def prints(lines: int) -> str:
    return (
        "import time\n"
        f"for i in range({lines}):\n"
        "    print(f'line {i}', flush=True)\n"
        "    time.sleep(0.1)\n"
    )


def numbered(first: int, last: int) -> list[str]:
    return [f"line {i}" for i in range(first, last)]


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """Keys and channels of this test only; what is left under it is deleted after."""
    name = f"astraeus-test:{uuid.uuid4().hex}"
    try:
        yield name
    finally:  # (after a bare yield it would not run: the loop's teardown closes this generator)
        async with Redis.from_url(REDIS_URL) as redis:
            keys = [key async for key in redis.scan_iter(match=f"{name}:*")]
            if keys:
                await redis.delete(*keys)


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    async with Redis.from_url(REDIS_URL, decode_responses=True) as client:
        yield client


@dataclass
class Replica:
    service: AgentService
    router: RedisRouter
    address: str


@contextlib.asynccontextmanager
async def replica(
    db: Database, clock: FakeClock, prefix: str, **options: Any
) -> AsyncIterator[Replica]:
    """An API replica's agent side: its gRPC endpoint and its router."""
    router = RedisRouter(REDIS_URL, prefix=prefix, **options)
    service = AgentService(
        db, clock, lease=timedelta(seconds=60), poll_interval=0.05, on_stream=router.stream_changed
    )
    address = f"127.0.0.1:{_port()}"
    async with router.serving(service):
        server = await serve(service, address)
        try:
            yield Replica(service, router, address)
        finally:
            await stop_serving(server, service)


@contextlib.asynccontextmanager
async def agent_of(address: str, token: str, data_dir: Path) -> AsyncIterator[None]:
    """The real agent of machine gpu-07, connected to ``address`` while inside."""
    running = asyncio.create_task(agent_for(address, token, data_dir).run_forever())
    try:
        yield
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def machine_id(db: Database) -> int:
    async with db.read() as session:
        found = await session.scalar(select(Machine.id).where(Machine.name == "gpu-07"))
    assert found is not None
    return found


async def claimed_by(redis: Redis, prefix: str, replica_id: str, machine: int) -> None:
    async def claimed() -> bool:
        return bool(await redis.get(f"{prefix}:machine:{machine}") == replica_id)

    await wait_for(f"the claim of {replica_id}", claimed)


async def refreshed(redis: Redis, key: str, holder: str, ttl_ms: int, times: int) -> None:
    """Until the claim at ``key`` was refreshed ``times`` times (its time to live rose), held
    by ``holder`` and within its TTL each time it is looked at."""
    last = await redis.pttl(key)
    seen = 0

    async def enough() -> bool:
        nonlocal last, seen
        assert await redis.get(key) == holder
        ttl = await redis.pttl(key)
        assert 0 < ttl <= ttl_ms
        seen += ttl > last
        last = ttl
        return seen >= times

    await wait_for(f"{times} refreshes of {key}", enough, seconds=10)


async def run_worker(db: Database, clock: FakeClock, tenancy: Tenancy, lines: int) -> WorkerRef:
    """Runs llama-sft-0, printing ``lines`` lines: the worker, as its machine knows it."""
    world = World(db, clock, tenancy)
    await world.submit(workers=1, gpus=1, command=[WORKLOAD_PYTHON, "-c", prints(lines)])
    await world.schedule()

    async def running() -> bool:
        return await worker_state(db, "llama-sft-0") == "Running"

    await wait_for("running", running)
    async with db.read() as session:
        row = await session.scalar(select(Worker).where(Worker.name == "llama-sft-0"))
    assert row is not None
    return WorkerRef(row.id, row.name)


async def completed(db: Database) -> None:
    async def done() -> bool:
        return await worker_state(db, "llama-sft-0") == "Completed"

    await wait_for("completed", done)


async def until(what: str, holds: Callable[[], object], seconds: float = 20) -> None:
    async def check() -> bool:
        return bool(holds())

    await wait_for(what, check, seconds)


def text_of(chunks: list[LogChunkInfo]) -> list[str]:
    return "".join(c.text for c in chunks).splitlines()


async def test_a_replica_without_the_stream_follows_and_tails_through_the_one_holding_it(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    machine_token: str,
    prefix: str,
    redis: Redis,
    tmp_path: Path,
) -> None:
    async with (
        replica(db, clock, prefix) as a,
        replica(db, clock, prefix) as b,
        agent_of(a.address, machine_token, tmp_path),
    ):
        await until("the machine", lambda: bool(a.service.streams.by_machine))
        machine = await machine_id(db)
        await claimed_by(redis, prefix, a.router.replica_id, machine)
        assert not b.service.streams.by_machine
        worker = await run_worker(db, clock, tenancy, lines=30)

        # A reader that goes away: the holder hears of it and tells the machine to stop.
        follower = b.router.follow(machine, worker, tail_lines=1000)
        first = await anext(follower)
        assert first.text.splitlines()[0] == "line 0"
        await follower.aclose()
        held = a.service.streams.by_machine[machine]
        await until("the stop", lambda: not held.follows and not a.router.relays)

        # A reader to the end: the lines as they are written, then the end.
        chunks = [c async for c in b.router.follow(machine, worker, tail_lines=1000)]
        assert chunks[-1].ended
        assert text_of(chunks) == numbered(0, 30)
        assert len(chunks) > 2
        assert sum(c.missed for c in chunks) == 0
        assert not b.router.backlogs and not b.router.pending
        await until("the relay's end", lambda: not a.router.relays)

        await completed(db)
        tail = await b.router.tail(machine, worker, 5, MAX_BYTES, wait_s=5)
        assert tail is not None
        assert (tail.worker, tail.archived) == ("llama-sft-0", True)
        assert tail.text.splitlines() == numbered(25, 30)


async def test_a_reader_that_falls_behind_is_told_how_many_lines_it_missed(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    machine_token: str,
    prefix: str,
    redis: Redis,
    tmp_path: Path,
) -> None:
    async with (
        replica(db, clock, prefix) as a,
        replica(db, clock, prefix, follow_buffer=2) as b,
        agent_of(a.address, machine_token, tmp_path),
    ):
        await until("the machine", lambda: bool(a.service.streams.by_machine))
        machine = await machine_id(db)
        await claimed_by(redis, prefix, a.router.replica_id, machine)
        worker = await run_worker(db, clock, tenancy, lines=20)
        follower = b.router.follow(machine, worker, tail_lines=1000)
        chunks = [await anext(follower)]
        await completed(db)  # meanwhile some 10 chunks came for a backlog of 2
        (backlog,) = b.router.backlogs.values()
        await until("the end in the backlog", lambda: any(c.ended for c in backlog.buffer.chunks))
        chunks += [c async for c in follower]

    assert chunks[-1].ended
    missed = sum(c.missed for c in chunks)
    assert missed > 0
    lines = text_of(chunks)
    assert len(lines) + missed == 20
    assert lines == sorted(lines, key=lambda line: int(line.split()[1]))  # in order, a gap
    assert len(chunks) <= 3


async def test_once_the_stream_closes_the_claim_goes_and_other_replicas_answer_none_at_once(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    machine_token: str,
    prefix: str,
    redis: Redis,
    tmp_path: Path,
) -> None:
    # A TTL of 1.5 s: at 0.6 s a CI lane's event loop, on two cores busy with eight lanes,
    # once paused past it between two refreshes and the claim lapsed (2026-12-05): the test
    # is of the refresh, not of how long a loaded machine may pause a process.
    async with replica(db, clock, prefix, claim_ttl=1.5) as a, replica(db, clock, prefix) as b:
        async with agent_of(a.address, machine_token, tmp_path):
            await until("the machine", lambda: bool(a.service.streams.by_machine))
            machine = await machine_id(db)
            key = f"{prefix}:machine:{machine}"
            await claimed_by(redis, prefix, a.router.replica_id, machine)
            # past the TTL: refreshed while the stream lives, every 0.5 s (a third of the
            # TTL); 7 refreshes: the claim outlived two TTLs (3 s and more)
            await refreshed(redis, key, a.router.replica_id, ttl_ms=1500, times=7)
            assert await redis.get(key) == a.router.replica_id
            assert 0 < await redis.pttl(key) <= 1500
        await until("the stream to close", lambda: not a.service.streams.by_machine)

        async def released() -> bool:
            return not await redis.exists(key)

        await wait_for("the claim to go", released, seconds=0.5)
        started = time.monotonic()
        assert await b.router.tail(machine, LLAMA, 5, MAX_BYTES, wait_s=5) is None
        assert [c async for c in b.router.follow(machine, LLAMA)] == []
        assert time.monotonic() - started < 0.5


async def test_the_claim_of_a_replica_that_died_is_answered_none_at_once_then_expires(
    prefix: str, redis: Redis
) -> None:
    router = RedisRouter(REDIS_URL, prefix=prefix)
    async with router.serving(None):
        await redis.set(f"{prefix}:machine:7", "gone-replica", px=300)
        started = time.monotonic()
        assert await router.tail(7, LLAMA, 5, MAX_BYTES, wait_s=5) is None
        assert [c async for c in router.follow(7, LLAMA)] == []
        assert time.monotonic() - started < 0.5  # nobody listens on its channel: no wait

        async def expired() -> bool:
            return not await redis.exists(f"{prefix}:machine:7")

        await wait_for("the claim to expire", expired, seconds=0.4)


async def next_message(inbox: PubSub) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        message = await inbox.get_message(ignore_subscribe_messages=True, timeout=0.5)
        if message is not None:
            return dict(json.loads(message["data"]))
    raise AssertionError("no message came")


async def test_a_holder_gone_silent_ends_the_follow_and_chunks_nobody_reads_are_stopped(
    prefix: str, redis: Redis
) -> None:
    """Spoken to by hand as a holder replica "ghost" that answers once, then falls silent."""
    router = RedisRouter(REDIS_URL, prefix=prefix, keepalive=0.2)
    async with router.serving(None), redis.pubsub() as ghost:
        await ghost.subscribe(f"{prefix}:replica:ghost")
        await redis.set(f"{prefix}:machine:7", "ghost", px=10_000)
        follower = router.follow(7, LLAMA, tail_lines=10)
        reading = asyncio.ensure_future(anext(follower))
        request = await next_message(ghost)
        keys = ("type", "reply_to", "machine", "worker", "worker_id", "tail_lines")
        assert {k: request[k] for k in keys} == {
            "type": "follow",
            "reply_to": router.replica_id,
            "machine": 7,
            "worker": "llama-sft-0",  # for sentences
            "worker_id": 41,  # what the holder asks its machine for
            "tail_lines": 10,
        }
        chunk = {
            "type": "chunk",
            "id": request["id"],
            "from": "ghost",
            "text": "line 0\n",
            "archived": False,
            "missed": 0,
            "ended": False,
        }
        await redis.publish(router.inbox, json.dumps(chunk))
        assert await reading == LogChunkInfo("line 0\n", archived=False, missed=0, ended=False)

        started = time.monotonic()
        assert [c async for c in follower] == []  # nothing for three keepalives: over
        assert 0.5 <= time.monotonic() - started < 2
        assert not router.backlogs

        await redis.publish(router.inbox, json.dumps(chunk))  # late: nobody reads it now
        assert await next_message(ghost) == {
            "type": "stop",
            "id": request["id"],
            "from": router.replica_id,
        }


REDIS_AWAY = (
    "The log of llama-sft-0 could not be fetched: this API replica does not hold its machine's "
    "stream, and Redis, which carries requests between replicas, cannot be reached."
)


async def test_with_redis_down_a_router_says_so_and_never_hangs() -> None:
    # issue 9: what the user sees while Redis is away is a clear error
    router = RedisRouter(f"redis://127.0.0.1:{_port()}/0")
    started = time.monotonic()
    async with router.serving(None):
        router.stream_changed(3, held=True)  # claims wait for Redis to come back
        with pytest.raises(LogUnavailable) as tail:
            await router.tail(7, LLAMA, 5, MAX_BYTES, wait_s=5)
        assert tail.value.message == REDIS_AWAY
        with pytest.raises(LogUnavailable) as follow:
            _ = [c async for c in router.follow(7, LLAMA)]
        assert follow.value.message == REDIS_AWAY
        assert not router.backlogs
    assert time.monotonic() - started < 5  # start (2 s at most) and the answers: no hang


@pytest.fixture
def redis_settings(settings: Settings) -> Iterator[Callable[[str], Settings]]:
    """An app in the Redis mode, with its agent endpoint; the embedded broker is put back."""

    def make(redis_url: str) -> Settings:
        return settings.model_copy(
            update={"broker": "redis", "redis_url": redis_url, "agent_port": _port()}
        )

    yield make
    job_broker.install(settings)


@contextlib.asynccontextmanager
async def serving(
    settings: Settings, db: Database, clock: FakeClock
) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """The app, started as uvicorn would, and a client of it."""
    app = create_app(settings, clock=clock, database=db)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://astraeus.test") as c:
            yield app, c


async def test_the_log_endpoint_answers_with_a_machine_held_by_another_replica(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    machine_token: str,
    prefix: str,
    redis: Redis,
    redis_settings: Callable[[str], Settings],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        redis_router, "PREFIX", prefix
    )  # this test's keys, for the app's router too
    async with (
        serving(redis_settings(REDIS_URL), db, clock) as (_, client),
        replica(db, clock, prefix) as a,
        agent_of(a.address, machine_token, tmp_path),
    ):
        await until("the machine", lambda: bool(a.service.streams.by_machine))
        await claimed_by(redis, prefix, a.router.replica_id, await machine_id(db))
        await run_worker(db, clock, tenancy, lines=20)
        await completed(db)
        answer = await client.get(
            "/v1/tasks/llama-sft-0/logs", params={"tail": 3}, headers=auth(tenancy.member_token)
        )
    assert answer.status_code == 200
    assert answer.json() == {
        "task_name": "llama-sft-0",
        "logs": "line 17\nline 18\nline 19\n",
        "archived": True,
    }


async def test_with_redis_down_the_log_endpoint_is_a_400_not_a_500(
    db: Database, clock: FakeClock, tenancy: Tenancy, redis_settings: Callable[[str], Settings]
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=1)
    await world.schedule()
    down = redis_settings(f"redis://127.0.0.1:{_port()}/0")
    async with serving(down, db, clock) as (_, client):
        started = time.monotonic()
        answer = await client.get("/v1/tasks/llama-sft-0/logs", headers=auth(tenancy.member_token))
        assert time.monotonic() - started < 5
    assert answer.status_code == 400
    assert answer.json()["code"] == "TASK_LOG_UNAVAILABLE"
    assert answer.json()["message"] == REDIS_AWAY


async def test_the_embedded_router_serves_the_log_endpoint_without_redis(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    machine_token: str,
    settings: Settings,
    tmp_path: Path,
) -> None:
    embedded = settings.model_copy(update={"agent_port": _port()})
    assert embedded.broker == "embedded"
    async with (
        serving(embedded, db, clock) as (app, client),
        agent_of(f"127.0.0.1:{embedded.agent_port}", machine_token, tmp_path),
    ):
        router = app.state.agents
        assert isinstance(router, routing.LocalRouter)
        await until("the machine", lambda: router.local and router.local.streams.by_machine)
        worker = await run_worker(db, clock, tenancy, lines=20)
        machine = await machine_id(db)
        chunks = [c async for c in router.follow(machine, worker, tail_lines=1000)]
        assert chunks[-1].ended
        assert text_of(chunks) == numbered(0, 20)
        await completed(db)
        answer = await client.get(
            "/v1/tasks/llama-sft-0/logs", params={"tail": 2}, headers=auth(tenancy.member_token)
        )
    assert answer.status_code == 200
    assert answer.json() == {
        "task_name": "llama-sft-0",
        "logs": "line 18\nline 19\n",
        "archived": True,
    }


def failures_to_ceiling() -> int:
    """How many attempts to listen again fail before the wait after one is the longest (the
    waits double from LISTEN_RETRY_FIRST up to LISTEN_RETRY_MAX)."""
    waits = Backoff(redis_router.LISTEN_RETRY_FIRST, redis_router.LISTEN_RETRY_MAX)
    failures = 1
    while waits.wait() < redis_router.LISTEN_RETRY_MAX:
        failures += 1
    return failures


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is needed")
async def test_a_replica_listens_again_within_a_second_or_so_of_redis_coming_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 9: until it listens again, log requests through it answer that Redis cannot be
    # reached; after a long outage it used to wait 5 s between attempts
    redis = PrivateRedis(tmp_path)
    redis.start()
    router = RedisRouter(redis.url)

    def attempts() -> int:
        return sum("listening again" in r.getMessage() for r in caplog.records)

    async def at_ceiling() -> bool:  # the wait after the last failed attempt is the longest
        return attempts() >= failures_to_ceiling()

    try:
        async with router.serving(None):
            assert router.listening.is_set()
            redis.kill()
            await wait_for("the waits to grow to their ceiling", at_ceiling, seconds=20)
            assert not router.listening.is_set()
            failed = attempts()

            async def another_failed() -> bool:  # the moment one fails: the longest wait
                return attempts() > failed

            await wait_for("an attempt to listen again", another_failed, seconds=10)
            redis.start()  # the same port
            back = time.monotonic()
            await asyncio.wait_for(router.listening.wait(), timeout=10)
            assert time.monotonic() - back < 2.0  # a second between attempts at most
    finally:
        redis.stop()
