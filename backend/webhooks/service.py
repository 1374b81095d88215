"""The webhooks domain's entry point.

A workspace subscribes a URL (with, optionally, the kinds of events it wants) and is given a
secret once. The ``webhooks.deliver`` actor then, every few seconds: hands each webhook's
new events to deliveries (``hand_out``, one transaction); claims the webhooks whose oldest
delivery is due, fairly between workspaces (``claim_due``, a short transaction); POSTs each
with no transaction open (``sending``, backend/webhooks/sender.py); and records what the
receiver answered, going on with that webhook's next delivery (``record``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend import ids
from backend.access.rules import Principal
from backend.clock import Clock
from backend.config import Settings
from backend.errors import InvalidInput, NotFound
from backend.events import service as events
from backend.events.rules import Cursor, advance
from backend.models import Webhook, WebhookDelivery
from backend.organizations import service as organizations
from backend.webhooks import repository, rules, sender
from backend.webhooks.addresses import Policy
from backend.webhooks.sender import Outgoing, Sent

HAND_OUT_BATCH = 1000  # events handed to one webhook per pass, at most
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
    policy: Policy | None = None,
) -> Webhook:
    """Subscribe a URL to the workspace's events from now on; its secret is made here and
    shown to the caller only in the answer to this request. A URL naming an address inside
    (``policy``: the admin's allow-list aside) is refused now; a name, at each delivery."""
    wanted = list(dict.fromkeys(kinds))
    problems = rules.check(url, wanted, policy)
    if problems:
        raise InvalidInput("INVALID_WEBHOOK", problems)
    ws = await organizations.workspace_for(session, principal, workspace)
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
    ws = await organizations.workspace_for(session, principal, workspace)
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
    ws = await organizations.workspace_for(session, principal, workspace)
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


async def claim_due(session: AsyncSession, clock: Clock, room: int) -> list[Outgoing]:
    """Up to ``room`` due deliveries, one per webhook (its oldest unsettled one), shared
    fairly between workspaces, none past a workspace's rules.WORKSPACE_IN_FLIGHT; each
    webhook claimed by this pass for rules.CLAIM."""
    now = clock.now()
    if room <= 0:
        return []
    await repository.lock_claims(session)
    heads = await repository.due_heads(session, now)
    picked = rules.fair_share(heads, await repository.in_flight(session, now), room)
    took = await repository.claim(session, [h.webhook_id for h in picked], now, now + rules.CLAIM)
    return await _outgoing(session, [h.delivery_id for h in picked if h.webhook_id in took])


async def _outgoing(session: AsyncSession, delivery_ids: Sequence[int]) -> list[Outgoing]:
    if not delivery_ids:
        return []
    found = []
    codec = await ids.session_codec(session)
    for row in await repository.outgoing(session, delivery_ids):
        view = events.view(row.event, row.workspace)
        shown = codec.show(ids.Kind.EVENT, row.event.id)
        found.append(
            Outgoing(
                delivery_id=row.delivery_id,
                webhook_id=row.webhook_id,
                event_id=shown,
                kind=row.event.kind,
                attempts=row.attempts,
                last_error=row.last_error,
                url=row.url,
                secret=row.secret,
                body=rules.body(view, shown),
            )
        )
    return found


def policy(settings: Settings) -> Policy:
    """Where webhooks may be sent: the admin's allow-list, the server's addresses and ports."""
    return sender.policy_for(settings)


def sending(settings: Settings, clock: Clock) -> AbstractAsyncContextManager[sender.Sender]:
    """What sends a pass's deliveries: destinations checked against the settings' allow-list
    and the server's own addresses and ports."""
    return sender.sending(sender.policy_for(settings), clock)


async def record(
    session: AsyncSession, clock: Clock, sent: Sent, *, go_on: bool = False
) -> Outgoing | None:
    """Delivered on a 2xx; otherwise tried again after the backoff, or given up. Then, with
    ``go_on``, once this one is settled: the webhook's next delivery if it is due, still
    claimed by this pass (in order, one at a time); else the webhook is let go."""
    now = clock.now()
    done = sent.delivery
    outcome = rules.after_attempt(done.attempts, sent.status, sent.error, done.last_error, now)
    await repository.record(session, done.delivery_id, outcome)
    settled = outcome.delivered_at is not None or outcome.gave_up_at is not None
    if go_on and settled:
        following = await repository.next_head(session, done.webhook_id, now)
        if following is not None:
            await repository.extend_claim(session, done.webhook_id, now + rules.CLAIM)
            return (await _outgoing(session, [following]))[0]
    await repository.extend_claim(session, done.webhook_id, None)
    return None


async def prune(session: AsyncSession, clock: Clock) -> int:
    """Deliveries settled (delivered or given up) over SETTLED_RETENTION ago deleted."""
    return await repository.delete_settled_before(session, clock.now() - SETTLED_RETENTION)
