"""Webhook deliveries end to end: the actor's body, a real receiver over HTTP, a fake clock.

Events become deliveries, are POSTed signed with their id and the time, retried with backoff
until a 2xx or 12 failures, in order per webhook, filtered by kind, handed out once even when
passes run at once, and fairly between workspaces. Receivers here listen on loopback, which
the tests' settings allow (as an admin's ASTRAEUS_WEBHOOK_ALLOW would)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from backend.access.rules import Principal
from backend.config import Settings, parse_networks
from backend.db import Database
from backend.ids import Kind
from backend.jobs import actors, runtime
from backend.models import Event, Webhook, WebhookDelivery, Workspace
from backend.webhooks import service as webhooks
from backend.webhooks.addresses import Policy
from tests.lifecycle.world import World
from tests.support import SEED_TIME, FakeClock, Tenancy, server_settings
from tests.support.ids import opened
from tests.webhooks.receiver import Receiver, receiving, stalling

Deliver = Callable[[], Awaitable[None]]


LOOPBACK = parse_networks("127.0.0.0/8")


@pytest.fixture
def settings(database_url: str, tmp_path: Any) -> Settings:
    """A server's settings that allow webhooks to loopback (where the receivers are)."""
    return server_settings(database_url, tmp_path).model_copy(update={"webhook_allow": LOOPBACK})


@pytest.fixture
async def deliver(settings: Settings, clock: FakeClock) -> AsyncIterator[Deliver]:
    """The ``webhooks.deliver`` actor's body, on the test's database and clock, and then the
    sending it left going (in a server, that goes on in the worker's event loop)."""
    runtime.configure(settings, clock)

    async def deliver_and_wait() -> None:
        await actors.BODIES["webhooks.deliver"]()
        await actors.webhooks_sent()

    try:
        yield deliver_and_wait
    finally:
        await actors.webhooks_sent()
        await runtime.database().dispose()
        runtime.configure(settings)


@pytest.fixture
def receiver() -> Any:
    with receiving() as r:
        yield r


async def principal(db: Database, clock: FakeClock, tenancy: Tenancy) -> Principal:
    return await World(db, clock, tenancy).principal()


async def subscribe(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    url: str,
    kinds: list[str] | None = None,
    *,
    token: str | None = None,
) -> Webhook:
    caller = await World(db, clock, tenancy).principal(token)
    async with db.transaction() as session:
        return await webhooks.create_webhook(
            session, clock, caller, url, kinds or [], policy=ALLOWED
        )


ALLOWED = Policy(allow=LOOPBACK)


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


def signed(secret: str, body: bytes, at: datetime) -> str:
    """What a receiver checks: v1 is the HMAC-SHA256 of "<t>.<body>" with the secret."""
    t = int(at.timestamp())
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


async def test_events_are_posted_signed_with_their_id(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    # seed L-47: events can be streamed to your own systems: posted to a receiver's URL
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
        "found_at": "2026-10-01T01:02:12.402117Z",  # issue 21
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
        "found_at": "2026-10-01T01:02:12.402117Z",
        "data": {"metric": "gpu"},
    }
    assert opened(Kind.EVENT, bodies[3]["id"]) == alert
    for request, content in zip(receiver.by_id, bodies, strict=True):
        assert request.path == "/hooks/astraeus"
        assert request.headers["x-astraeus-event-id"] == content["id"]
        assert request.headers["x-astraeus-event-kind"] == content["kind"]
        assert request.headers["x-astraeus-signature"] == signed(
            webhook.secret, request.body, clock.now()
        )
        assert request.headers["user-agent"] == "astraeus-webhooks"
        assert request.headers["content-type"] == "application/json"
    assert [
        (d.event_id, d.delivered_at, d.attempts, d.last_status) for d in await deliveries(db)
    ] == [(opened(Kind.EVENT, b["id"]), clock.now(), 0, 204) for b in bodies]
    # Delivered once: later passes send nothing again.
    clock.advance(hours=2)
    await deliver()
    assert len(receiver.received) == 4


async def test_a_failing_receiver_gets_the_event_again_after_the_backoff(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    webhook = await subscribe(db, clock, tenancy, receiver.url)
    event = await add_event(db, clock, "run.state")
    receiver.statuses = [500]
    await deliver()
    [delivery] = await deliveries(db)
    assert (delivery.attempts, delivery.last_status, delivery.last_error) == (
        1,
        500,
        "failed: HTTP 500",
    )
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
    # each attempt signed at its own time: a receiver refusing old ones takes the retry
    assert first.headers["x-astraeus-signature"] == signed(webhook.secret, first.body, SEED_TIME)
    assert second.headers["x-astraeus-signature"] == signed(webhook.secret, first.body, clock.now())
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
        "failed: HTTP 500",
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
    with receiving() as other:
        await subscribe(db, clock, tenancy, other.url)  # delivered at once
        await add_event(db, clock, "run.state")
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
    assert (delivery.attempts, delivery.last_status, delivery.last_error) == (1, None, "failed")


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
    assert (delivery.attempts, delivery.last_error) == (1, "failed: HTTP 503")


async def test_a_webhooks_deliveries_go_in_order_one_at_a_time(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    await subscribe(db, clock, tenancy, receiver.url)
    first, second, third = [await add_event(db, clock, "run.state") for _ in range(3)]
    receiver.statuses = [500]
    await deliver()
    # the first failed: the others wait behind it, untried
    assert [r.event_id for r in receiver.received] == [first]
    assert [(d.event_id, d.attempts, d.delivered_at) for d in await deliveries(db)] == [
        (first, 1, None),
        (second, 0, None),
        (third, 0, None),
    ]
    clock.advance(seconds=9)
    await deliver()
    assert len(receiver.received) == 1
    clock.advance(seconds=1)
    await deliver()  # the first again, then the others after it, in one pass
    assert [r.event_id for r in receiver.received] == [first, first, second, third]
    assert all(d.delivered_at == clock.now() for d in await deliveries(db))


async def test_one_given_up_lets_the_next_go(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    await subscribe(db, clock, tenancy, receiver.url)
    first, second = [await add_event(db, clock, "run.state") for _ in range(2)]
    receiver.statuses = [500] * 12
    for _ in range(12):
        await deliver()
        [head, _] = await deliveries(db)
        clock.moment = head.next_attempt_at
    assert [r.event_id for r in receiver.received] == [first] * 12 + [second]
    [gave_up, delivered] = await deliveries(db)
    assert (gave_up.attempts, gave_up.gave_up_at is not None) == (12, True)
    assert delivered.delivered_at is not None


async def test_a_workspace_whose_receivers_never_answer_holds_back_no_other(
    db: Database, clock: FakeClock, tenancy: Tenancy, receiver: Receiver, deliver: Deliver
) -> None:
    # 40 webhooks of 'default' to a receiver that takes connections and never answers; one
    # of team-b's: its event goes out at once, and 'default' has 4 deliveries out at a time
    with stalling() as stalled:
        for _ in range(40):
            await subscribe(db, clock, tenancy, stalled.url)
        team_b = await subscribe(db, clock, tenancy, receiver.url, token=tenancy.other_token)
        await add_event(db, clock, "run.state")
        theirs = await add_event(db, clock, "run.state", workspace="team-b")
        started = time.monotonic()
        await actors.BODIES["webhooks.deliver"]()  # the pass, without waiting for what it left
        await asyncio.to_thread(receiver.arrived.wait, 10)
        assert receiver.event_ids == [theirs]
        assert time.monotonic() - started < 10
        # received before any of 'default''s attempts timed out: it waited behind none of them
        defaults = [d for d in await deliveries(db) if d.webhook_id != team_b.id]
        assert len(defaults) == 40 and all(d.attempts == 0 for d in defaults)
        await actors.BODIES["webhooks.deliver"]()  # a second pass finds 'default' at its cap
        await actors.webhooks_sent()
        assert len(stalled.connections) == 4
    tried = [d for d in await deliveries(db) if d.attempts]
    assert [(d.attempts, d.last_status, d.last_error) for d in tried] == [(1, None, "failed")] * 4


async def test_addresses_inside_are_refused_when_sent(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    receiver: Receiver,
    database_url: str,
    tmp_path: Any,
) -> None:
    # created where loopback was allowed; sent by a server that allows none: refused at the
    # delivery, also for a name (this machine's) that resolves inside, and nothing reached
    host = socket.gethostname()
    resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    if all(ipaddress.ip_address(a).is_global for a in resolved):
        pytest.skip(f"{host} resolves to no address inside")
    port = receiver.url.split(":")[2].split("/")[0]
    await subscribe(db, clock, tenancy, receiver.url)
    await subscribe(db, clock, tenancy, f"http://{host}:{port}/hooks/astraeus")
    await add_event(db, clock, "run.state")
    strict = server_settings(database_url, tmp_path)
    runtime.configure(strict, clock)
    try:
        await actors.BODIES["webhooks.deliver"]()
        await actors.webhooks_sent()
    finally:
        await runtime.database().dispose()
        runtime.configure(strict)
    assert receiver.received == []
    assert [(d.attempts, d.last_status, d.last_error) for d in await deliveries(db)] == [
        (1, None, "refused: private address")
    ] * 2


async def test_the_servers_own_port_is_refused_even_where_loopback_is_allowed(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    receiver: Receiver,
    settings: Settings,
) -> None:
    port = int(receiver.url.split(":")[2].split("/")[0])
    await subscribe(db, clock, tenancy, receiver.url)
    await add_event(db, clock, "run.state")
    itself = settings.model_copy(update={"port": port})
    runtime.configure(itself, clock)
    try:
        await actors.BODIES["webhooks.deliver"]()
        await actors.webhooks_sent()
    finally:
        await runtime.database().dispose()
        runtime.configure(settings)
    assert receiver.received == []
    [delivery] = await deliveries(db)
    assert delivery.last_error == "refused: private address"


async def test_passes_at_once_keep_a_workspace_under_its_cap(
    db: Database, clock: FakeClock, tenancy: Tenancy, deliver: Deliver
) -> None:
    # claims are taken one pass at a time: three passes at once send 4 of its 10, not 12
    with stalling() as stalled:
        for _ in range(10):
            await subscribe(db, clock, tenancy, stalled.url)
        await add_event(db, clock, "run.state")
        body = actors.BODIES["webhooks.deliver"]
        await asyncio.gather(body(), body(), body())
        await actors.webhooks_sent()
        assert len(stalled.connections) == 4
    assert sum(d.attempts for d in await deliveries(db)) == 4
