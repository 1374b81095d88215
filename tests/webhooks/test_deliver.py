"""Webhook deliveries end to end: the actor's body, a real receiver over HTTP, a fake clock.

Events become deliveries, are POSTed signed with their id, retried with backoff until a 2xx
or 12 failures, filtered by kind, and handed out once even when passes run at once."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from backend.access.rules import Principal
from backend.config import Settings
from backend.db import Database
from backend.jobs import actors, runtime
from backend.models import Event, Webhook, WebhookDelivery, Workspace
from backend.webhooks import service as webhooks
from tests.lifecycle.world import World
from tests.support import SEED_TIME, FakeClock, Tenancy
from tests.webhooks.receiver import Receiver, receiving

Deliver = Callable[[], Awaitable[None]]


@pytest.fixture
async def deliver(settings: Settings, clock: FakeClock) -> AsyncIterator[Deliver]:
    """The ``webhooks.deliver`` actor's body, on the test's database and clock."""
    runtime.configure(settings, clock)
    try:
        yield actors.BODIES["webhooks.deliver"]
    finally:
        await runtime.database().dispose()
        runtime.configure(settings)


@pytest.fixture
def receiver() -> Any:
    with receiving() as r:
        yield r


async def principal(db: Database, clock: FakeClock, tenancy: Tenancy) -> Principal:
    return await World(db, clock, tenancy).principal()


async def subscribe(
    db: Database, clock: FakeClock, tenancy: Tenancy, url: str, kinds: list[str] | None = None
) -> Webhook:
    caller = await principal(db, clock, tenancy)
    async with db.transaction() as session:
        return await webhooks.create_webhook(session, clock, caller, url, kinds or [])


async def add_event(
    db: Database, clock: FakeClock, kind: str, workspace: str = "default", **fields: Any
) -> int:
    """An event as the other domains write them (alerts, runs, …)."""
    async with db.transaction() as session:
        ws = await session.scalar(select(Workspace).where(Workspace.name == workspace))
        assert ws is not None
        event = Event(
            organization_id=ws.organization_id,
            workspace_id=ws.id,
            kind=kind,
            state=fields.get("state"),
            reason=fields.get("reason", f"a {kind} event"),
            data=fields.get("data", {}),
            created_at=clock.now(),
        )
        session.add(event)
        await session.flush()
        return event.id


async def deliveries(db: Database) -> list[WebhookDelivery]:
    async with db.read() as session:
        return list(
            await session.scalars(
                select(WebhookDelivery).order_by(WebhookDelivery.webhook_id, WebhookDelivery.id)
            )
        )


def signed(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def test_events_are_posted_signed_with_their_id(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    world = World(db, clock, tenancy)
    await world.submit(name="before")  # before the webhook: not sent
    webhook = await subscribe(db, clock, tenancy, receiver.url)
    clock.advance(seconds=1)
    await world.submit(name="llama-sft", workers=2)
    alert = await add_event(
        db, clock, "alert.firing", reason="Goodput 31% under 50%", data={"metric": "gpu"}
    )
    await deliver()

    bodies = [r.json for r in receiver.by_id]
    assert [(b["kind"], b["run"], b["worker"]) for b in bodies] == [
        ("run.state", "llama-sft", None),
        ("worker.state", "llama-sft", "llama-sft-0"),
        ("worker.state", "llama-sft", "llama-sft-1"),
        ("alert.firing", None, None),
    ]
    assert bodies[0] == {
        "id": bodies[0]["id"],
        "kind": "run.state",
        "state": "Pending",
        "reason": "Run created",
        "run": "llama-sft",
        "worker": None,
        "workspace": "default",
        "created_at": "2026-10-01T01:02:12.402117Z",
        "data": {},
    }
    assert bodies[3] | {"id": 0} == {
        "id": 0,
        "kind": "alert.firing",
        "state": None,
        "reason": "Goodput 31% under 50%",
        "run": None,
        "worker": None,
        "workspace": "default",
        "created_at": "2026-10-01T01:02:12.402117Z",
        "data": {"metric": "gpu"},
    }
    assert bodies[3]["id"] == alert
    for request, content in zip(receiver.by_id, bodies, strict=True):
        assert request.path == "/hooks/astraeus"
        assert request.headers["x-astraeus-event-id"] == str(content["id"])
        assert request.headers["x-astraeus-event-kind"] == content["kind"]
        assert request.headers["x-astraeus-signature"] == signed(webhook.secret, request.body)
        assert request.headers["user-agent"] == "astraeus-webhooks"
        assert request.headers["content-type"] == "application/json"
    assert [
        (d.event_id, d.delivered_at, d.attempts, d.last_status) for d in await deliveries(db)
    ] == [(b["id"], clock.now(), 0, 204) for b in bodies]
    # Delivered once: later passes send nothing again.
    clock.advance(hours=2)
    await deliver()
    assert len(receiver.received) == 4


async def test_a_failing_receiver_gets_the_event_again_after_the_backoff(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    await subscribe(db, clock, tenancy, receiver.url)
    event = await add_event(db, clock, "run.state")
    receiver.statuses = [500]
    await deliver()
    [delivery] = await deliveries(db)
    assert (delivery.attempts, delivery.last_status, delivery.last_error) == (1, 500, "HTTP 500")
    assert delivery.next_attempt_at == SEED_TIME + timedelta(seconds=10)
    assert delivery.delivered_at is None

    clock.advance(seconds=9.9)
    await deliver()
    assert receiver.event_ids == [event]  # not due yet
    clock.advance(seconds=0.1)
    await deliver()
    assert receiver.event_ids == [event, event]
    first, second = receiver.received
    assert first.body == second.body
    assert first.headers["x-astraeus-signature"] == second.headers["x-astraeus-signature"]
    [delivery] = await deliveries(db)
    assert (delivery.attempts, delivery.delivered_at, delivery.last_status) == (
        1,
        clock.now(),
        204,
    )


async def test_it_gives_up_after_twelve_failed_attempts(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    await subscribe(db, clock, tenancy, receiver.url)
    await add_event(db, clock, "run.state")
    receiver.then = 500
    waits = []
    for _ in range(12):
        await deliver()
        [delivery] = await deliveries(db)
        if delivery.gave_up_at is not None:
            break
        waits.append((delivery.next_attempt_at - clock.now()).total_seconds())
        clock.moment = delivery.next_attempt_at
    assert waits == [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600]
    assert (delivery.attempts, delivery.gave_up_at, delivery.last_error) == (
        12,
        clock.now(),
        "HTTP 500",
    )
    assert len(receiver.received) == 12
    clock.advance(days=1)
    await deliver()
    assert len(receiver.received) == 12


async def test_settled_deliveries_are_deleted_after_30_days(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    receiver: Receiver,
    deliver: Deliver,
    settings: Settings,
) -> None:
    # the deliveries table holds a month of events: delivered and given-up ones go after 30
    # days (the webhooks.prune actor, every ten minutes); one still being retried stays
    await subscribe(db, clock, tenancy, receiver.url)
    receiver.statuses = [500]  # refused: to be retried in 10 s
    await add_event(db, clock, "run.state", reason="refused once")
    await deliver()
    await add_event(db, clock, "run.state")  # delivered at once
    await deliver()
    [retried, delivered] = await deliveries(db)
    assert delivered.delivered_at == clock.now() and retried.delivered_at is None
    prune = actors.BODIES["webhooks.prune"]
    clock.advance(days=30)
    await prune()  # 30 days to the second: kept
    assert len(await deliveries(db)) == 2
    clock.advance(seconds=1)
    await prune()
    assert [d.id for d in await deliveries(db)] == [retried.id]
    await prune()  # a redelivered message changes nothing
    assert [d.id for d in await deliveries(db)] == [retried.id]


async def test_a_receiver_that_is_not_listening(
    db: Database, clock: FakeClock, tenancy: Tenancy, deliver: Deliver
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    await subscribe(db, clock, tenancy, f"http://127.0.0.1:{port}/hook")
    await add_event(db, clock, "run.state")
    await deliver()
    [delivery] = await deliveries(db)
    assert (delivery.attempts, delivery.last_status, delivery.last_error) == (
        1,
        None,
        "connection refused",
    )


async def test_kinds_filter_what_a_webhook_gets(
    db: Database, clock: FakeClock, tenancy: Tenancy, deliver: Deliver
) -> None:
    with receiving() as alerts, receiving() as runs, receiving() as everything:
        await subscribe(db, clock, tenancy, alerts.url, ["alert"])
        await subscribe(db, clock, tenancy, runs.url, ["run.state", "alert.resolved"])
        await subscribe(db, clock, tenancy, everything.url)
        ids = {
            kind: await add_event(db, clock, kind)
            for kind in ("alert.firing", "run.state", "alerting", "worker.state", "alert.resolved")
        }
        await add_event(db, clock, "run.state", workspace="team-b")  # not this workspace's
        await deliver()
        assert alerts.event_ids == [ids["alert.firing"], ids["alert.resolved"]]
        assert runs.event_ids == [ids["run.state"], ids["alert.resolved"]]
        assert everything.event_ids == sorted(ids.values())


async def test_passes_running_at_once_send_each_event_once(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    webhook = await subscribe(db, clock, tenancy, receiver.url)
    events = [await add_event(db, clock, "run.state") for _ in range(40)]
    await asyncio.gather(deliver(), deliver(), deliver())
    assert sorted(receiver.event_ids) == events
    handed = await deliveries(db)
    assert sorted(d.event_id for d in handed) == events
    assert all(d.delivered_at is not None for d in handed)
    # Handing out alone, at once, from separate transactions: one delivery per event.
    more = [await add_event(db, clock, "run.state") for _ in range(5)]

    async def hand_out() -> int:
        async with db.transaction() as session:
            return await webhooks.hand_out(session, clock)

    assert sorted(await asyncio.gather(hand_out(), hand_out())) == [0, 5]
    assert sorted(d.event_id for d in await deliveries(db)) == events + more
    assert {d.webhook_id for d in await deliveries(db)} == {webhook.id}


async def test_the_cursor_moves_once_the_events_before_it_have_settled(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    webhook = await subscribe(db, clock, tenancy, receiver.url)
    events = [await add_event(db, clock, "run.state") for _ in range(3)]

    async def cursor() -> tuple[int, int]:
        async with db.read() as session:
            row = await session.get(Webhook, webhook.id)
            assert row is not None
            return row.cursor, row.horizon

    start = webhook.cursor
    await deliver()
    assert await cursor() == (start, events[-1])
    clock.advance(seconds=59)
    await deliver()
    assert await cursor() == (start, events[-1])
    clock.advance(seconds=1)
    await deliver()
    assert await cursor() == (events[-1], events[-1])
    assert receiver.event_ids == events


async def test_an_event_committed_after_a_later_one_is_still_sent(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: events become visible in id order")
    await subscribe(db, clock, tenancy, receiver.url)
    async with db.transaction() as slow:  # takes its id first, commits last
        ws = await slow.scalar(select(Workspace).where(Workspace.name == "default"))
        assert ws is not None
        early = Event(
            organization_id=ws.organization_id,
            workspace_id=ws.id,
            kind="run.state",
            reason="committed late",
            data={},
            created_at=clock.now(),
        )
        slow.add(early)
        await slow.flush()
        late = await add_event(db, clock, "run.state")
        assert early.id < late
        await deliver()
        assert receiver.event_ids == [late]
        clock.advance(seconds=30)
        await deliver()
    clock.advance(seconds=30)  # the cursor may now move past both: not before sending
    await deliver()
    assert [r.event_id for r in receiver.received] == [late, early.id]


async def test_a_deleted_webhook_gets_nothing_more(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    webhook = await subscribe(db, clock, tenancy, receiver.url)
    receiver.statuses = [503]
    await add_event(db, clock, "run.state")
    await deliver()
    caller = await principal(db, clock, tenancy)
    async with db.transaction() as session:
        await webhooks.delete_webhook(session, clock, caller, webhook.id)
    await add_event(db, clock, "run.state")
    clock.advance(minutes=5)
    await deliver()
    assert len(receiver.received) == 1
    [delivery] = await deliveries(db)
    assert (delivery.attempts, delivery.last_error) == (1, "HTTP 503")
