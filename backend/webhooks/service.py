"""The webhooks domain's entry point.

A workspace subscribes a URL (with, optionally, the kinds of events it wants) and is given a
secret once. The ``webhooks.deliver`` actor then, every few seconds: hands each webhook's
new events to deliveries (``hand_out``, one transaction); claims the deliveries that are due
(``claim_due``, a short transaction); POSTs them with no transaction open (``send``); and
records what the receivers answered (``record``).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.clock import Clock
from backend.errors import InvalidInput, NotFound
from backend.events import service as events
from backend.events.rules import Cursor, advance
from backend.models import Webhook, WebhookDelivery
from backend.runs import service as runs
from backend.webhooks import repository, rules

HAND_OUT_BATCH = 1000  # events handed to one webhook per pass, at most
SEND_BATCH = 16  # deliveries POSTed at a time
RECENT_DELIVERIES = 20  # shown per webhook
# Deliveries delivered or given up are kept this long (the recent ones a webhook lists), then
# deleted: one a receiver never acknowledged stays until its twelfth attempt, however long.
SETTLED_RETENTION = timedelta(days=30)


async def create_webhook(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    url: str,
    kinds: Sequence[str] = (),
    *,
    workspace: str | None = None,
) -> Webhook:
    """Subscribe a URL to the workspace's events from now on; its secret is made here and
    shown to the caller only in the answer to this request."""
    wanted = list(dict.fromkeys(kinds))
    problems = rules.check(url, wanted)
    if problems:
        raise InvalidInput("INVALID_WEBHOOK", problems)
    ws = await runs.workspace_for(session, principal, workspace)
    start = await repository.last_event_id(session, ws.id)
    webhook = Webhook(
        workspace_id=ws.id,
        url=url,
        secret="whsec_" + secrets.token_urlsafe(32),
        kinds=wanted,
        created_at=clock.now(),
        cursor=start,
        horizon=start,
    )
    repository.add(session, webhook)
    await session.flush()
    return webhook


async def list_webhooks(
    session: AsyncSession, principal: Principal, *, workspace: str | None = None
) -> list[Webhook]:
    ws = await runs.workspace_for(session, principal, workspace)
    return await repository.active(session, ws.id)


async def delete_webhook(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    webhook_id: int,
    *,
    workspace: str | None = None,
) -> Webhook:
    """Nothing more is handed to it or sent; deliveries not yet made are abandoned."""
    ws = await runs.workspace_for(session, principal, workspace)
    webhook = await repository.get_active(session, ws.id, webhook_id)
    if webhook is None:
        raise NotFound("WEBHOOK_NOT_FOUND", f"No webhook {webhook_id} in workspace '{ws.name}'.")
    webhook.disabled_at = clock.now()
    await session.flush()
    return webhook


async def recent_deliveries(
    session: AsyncSession, webhook_ids: Sequence[int]
) -> dict[int, list[tuple[WebhookDelivery, str]]]:
    return await repository.recent_deliveries(session, webhook_ids, RECENT_DELIVERIES)


async def hand_out(session: AsyncSession, clock: Clock) -> int:
    """Each webhook's new events become deliveries due now; returns how many.

    Each webhook is locked while its events are handed out, so passes running at once hand
    each event to it once; the unique (webhook, event) key would refuse a second anyway."""
    now = clock.now()
    handed = 0
    for webhook_id in await repository.active_ids(session):
        handed += await _hand_out_to(session, webhook_id, now)
    return handed


async def _hand_out_to(session: AsyncSession, webhook_id: int, now: datetime) -> int:
    webhook = await repository.lock(session, webhook_id)
    if webhook is None:  # deleted since
        return 0
    # The last id is read before the events, so every event up to it is among them.
    last = await repository.last_event_id(session, webhook.workspace_id)
    event_ids = await repository.unhanded_events(session, webhook, HAND_OUT_BATCH)
    await repository.add_deliveries(session, webhook.id, event_ids, now)
    looked_to = event_ids[-1] if len(event_ids) == HAND_OUT_BATCH else last
    current = Cursor(webhook.cursor, webhook.horizon, webhook.horizon_at)
    moved = advance(current, max(webhook.cursor, looked_to), now)
    if moved != current:
        await repository.set_cursor(session, webhook.id, moved)
    return len(event_ids)


@dataclass(frozen=True)
class Outgoing:
    """A delivery claimed by this pass, ready to send."""

    delivery_id: int
    event_id: int
    attempts: int
    last_error: str | None
    url: str
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class Sent:
    """What one POST got: a status, or why there was none."""

    delivery: Outgoing
    status: int | None
    error: str | None


async def claim_due(session: AsyncSession, clock: Clock) -> list[Outgoing]:
    """Up to SEND_BATCH deliveries due now, claimed by this pass for rules.CLAIM."""
    now = clock.now()
    claimed = await repository.claim_due(session, now, now + rules.CLAIM, SEND_BATCH)
    if not claimed:
        return []
    found = []
    for row in await repository.outgoing(session, claimed):
        event = row.event
        view = events.view(event, row.workspace)
        content = rules.body(view)
        found.append(
            Outgoing(
                delivery_id=row.delivery_id,
                event_id=event.id,
                attempts=row.attempts,
                last_error=row.last_error,
                url=row.url,
                body=content,
                headers=rules.headers(view, row.secret, content),
            )
        )
    return found


async def send(deliveries: Sequence[Outgoing]) -> list[Sent]:
    """POST each delivery, all at once. No database here: nothing is held open while a
    receiver takes its time."""
    timeout = httpx.Timeout(rules.TIMEOUT_S)
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
        return list(await asyncio.gather(*(_post(client, d) for d in deliveries)))


async def _post(client: httpx.AsyncClient, delivery: Outgoing) -> Sent:
    try:
        async with asyncio.timeout(rules.TIMEOUT_S):
            # Streamed and never read: only the status counts, however big the answer.
            async with client.stream(
                "POST", delivery.url, content=delivery.body, headers=delivery.headers
            ) as response:
                return Sent(delivery, response.status_code, None)
    except (TimeoutError, httpx.TimeoutException):
        return Sent(delivery, None, f"timed out after {rules.TIMEOUT_S:g}s")
    except Exception as error:  # whatever a receiver does fails its attempt, not the pass
        return Sent(delivery, None, _why(error))


def _why(error: BaseException) -> str:
    """A short reason for an attempt that got no answer."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, ConnectionResetError):
            return "connection reset"
        if isinstance(cause, socket.gaierror):
            return "could not resolve the host"
        cause = cause.__cause__ or cause.__context__
    message = str(error)
    return (f"{type(error).__name__}: {message}" if message else type(error).__name__)[:1000]


async def record(session: AsyncSession, clock: Clock, sent: Sequence[Sent]) -> int:
    """Delivered on a 2xx; otherwise tried again after the backoff, or given up. Returns how
    many were delivered."""
    now = clock.now()
    delivered = 0
    for attempt in sent:
        outcome = rules.after_attempt(
            attempt.delivery.attempts,
            attempt.status,
            attempt.error,
            attempt.delivery.last_error,
            now,
        )
        await repository.record(session, attempt.delivery.delivery_id, outcome)
        delivered += outcome.delivered_at is not None
    return delivered


async def prune(session: AsyncSession, clock: Clock) -> int:
    """Deliveries settled (delivered or given up) over SETTLED_RETENTION ago deleted."""
    return await repository.delete_settled_before(session, clock.now() - SETTLED_RETENTION)
