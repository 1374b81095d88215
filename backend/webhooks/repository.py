"""All SQL of webhooks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, exists, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.events.rules import Cursor
from backend.models import Event, Webhook, WebhookDelivery, Workspace
from backend.webhooks.rules import Head, Outcome


def add(session: AsyncSession, webhook: Webhook) -> None:
    session.add(webhook)


async def last_event_id(session: AsyncSession, workspace_id: int) -> int:
    found = await session.scalar(
        select(func.max(Event.id)).where(Event.workspace_id == workspace_id)
    )
    return int(found or 0)


async def active(session: AsyncSession, workspace_id: int) -> list[Webhook]:
    return list(
        await session.scalars(
            select(Webhook)
            .where(Webhook.workspace_id == workspace_id, Webhook.disabled_at.is_(None))
            .order_by(Webhook.id)
        )
    )


async def get_active(session: AsyncSession, workspace_id: int, webhook_id: int) -> Webhook | None:
    return await session.scalar(
        select(Webhook).where(
            Webhook.id == webhook_id,
            Webhook.workspace_id == workspace_id,
            Webhook.disabled_at.is_(None),
        )
    )


async def active_ids(session: AsyncSession) -> list[int]:
    """Webhooks not deleted whose workspace has events past their cursor: the others have
    nothing to hand out (a pass every 2 s costs them this one statement)."""
    newer = exists().where(Event.workspace_id == Webhook.workspace_id, Event.id > Webhook.cursor)
    return list(
        await session.scalars(
            select(Webhook.id).where(Webhook.disabled_at.is_(None), newer).order_by(Webhook.id)
        )
    )


async def lock(session: AsyncSession, webhook_id: int) -> Webhook | None:
    """The webhook, locked until the transaction ends (None once deleted).

    An UPDATE, not SELECT … FOR UPDATE: it locks the row on PostgreSQL and takes SQLite's
    write lock, so on both a second pass waits here and then reads what the first wrote."""
    locked = await session.execute(
        update(Webhook)
        .where(Webhook.id == webhook_id, Webhook.disabled_at.is_(None))
        .values(cursor=Webhook.cursor)
        .execution_options(synchronize_session=False)
    )
    if locked.rowcount == 0:  # type: ignore[attr-defined]
        return None
    return await session.scalar(
        select(Webhook).where(Webhook.id == webhook_id).execution_options(populate_existing=True)
    )


async def unhanded_events(session: AsyncSession, webhook: Webhook, limit: int) -> list[int]:
    """Ids of the workspace's events past the cursor that the webhook wants and has no
    delivery for yet, oldest first."""
    handed = exists().where(
        WebhookDelivery.webhook_id == webhook.id, WebhookDelivery.event_id == Event.id
    )
    query = select(Event.id).where(
        Event.workspace_id == webhook.workspace_id, Event.id > webhook.cursor, ~handed
    )
    if webhook.kinds:
        query = query.where(
            or_(
                *(
                    or_(Event.kind == k, Event.kind.startswith(k + ".", autoescape=True))
                    for k in webhook.kinds
                )
            )
        )
    return list(await session.scalars(query.order_by(Event.id).limit(limit)))


async def add_deliveries(
    session: AsyncSession, webhook_id: int, event_ids: Sequence[int], now: datetime
) -> None:
    if not event_ids:
        return
    await session.execute(
        insert(WebhookDelivery),
        [
            {
                "webhook_id": webhook_id,
                "event_id": event_id,
                "attempts": 0,
                "next_attempt_at": now,
                "created_at": now,
            }
            for event_id in event_ids
        ],
    )


async def set_cursor(session: AsyncSession, webhook_id: int, cursor: Cursor) -> None:
    await session.execute(
        update(Webhook)
        .where(Webhook.id == webhook_id)
        .values(cursor=cursor.cursor, horizon=cursor.horizon, horizon_at=cursor.horizon_at)
        .execution_options(synchronize_session=False)
    )


def _unsettled() -> Any:
    return WebhookDelivery.delivered_at.is_(None) & WebhookDelivery.gave_up_at.is_(None)


async def lock_claims(session: AsyncSession) -> None:
    """Claims are taken one pass at a time (until the transaction ends), so that no two passes
    both see a workspace under its cap and both send: PostgreSQL's transaction-scoped
    advisory lock. (SQLite's write transactions begin holding its write lock: db/engine.py.)"""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(select(func.pg_advisory_xact_lock(CLAIM_LOCK)))


CLAIM_LOCK = 0x77656268  # "webh": the advisory lock's key


def _idle(now: datetime) -> Any:
    return or_(Webhook.sending_until.is_(None), Webhook.sending_until <= now)


async def due_heads(session: AsyncSession, now: datetime) -> list[Head]:
    """Each webhook's oldest unsettled delivery, where that is due and no pass is sending the
    webhook's deliveries (of webhooks not deleted)."""
    head = (
        select(WebhookDelivery.id)
        .where(WebhookDelivery.webhook_id == Webhook.id, _unsettled())
        .order_by(WebhookDelivery.event_id)
        .limit(1)
        .correlate(Webhook)
        .scalar_subquery()
    )
    rows = await session.execute(
        select(
            Webhook.id, Webhook.workspace_id, WebhookDelivery.id, WebhookDelivery.next_attempt_at
        )
        .join(WebhookDelivery, WebhookDelivery.id == head)
        .where(
            Webhook.disabled_at.is_(None),
            _idle(now),
            WebhookDelivery.next_attempt_at <= now,
        )
    )
    return [Head(*row) for row in rows]


async def in_flight(session: AsyncSession, now: datetime) -> dict[int, int]:
    """How many webhooks of each workspace are being sent now."""
    rows = await session.execute(
        select(Webhook.workspace_id, func.count())
        .where(Webhook.sending_until > now)
        .group_by(Webhook.workspace_id)
    )
    return {workspace: int(count) for workspace, count in rows}


async def claim(
    session: AsyncSession, webhook_ids: Sequence[int], now: datetime, until: datetime
) -> set[int]:
    """These webhooks are sent by this pass until ``until`` (or until it lets them go); the
    ones it took (none that another holds)."""
    if not webhook_ids:
        return set()
    claimed = await session.scalars(
        update(Webhook)
        .where(Webhook.id.in_(webhook_ids), _idle(now))
        .values(sending_until=until)
        .returning(Webhook.id)
        .execution_options(synchronize_session=False)
    )
    return set(claimed)


async def extend_claim(session: AsyncSession, webhook_id: int, until: datetime | None) -> None:
    """Held until ``until``, or let go (None)."""
    await session.execute(
        update(Webhook)
        .where(Webhook.id == webhook_id)
        .values(sending_until=until)
        .execution_options(synchronize_session=False)
    )


async def next_head(session: AsyncSession, webhook_id: int, now: datetime) -> int | None:
    """The webhook's oldest unsettled delivery, if it is due (and the webhook not deleted)."""
    found = (
        await session.execute(
            select(WebhookDelivery.id, WebhookDelivery.next_attempt_at)
            .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
            .where(
                WebhookDelivery.webhook_id == webhook_id,
                Webhook.disabled_at.is_(None),
                _unsettled(),
            )
            .order_by(WebhookDelivery.event_id)
            .limit(1)
        )
    ).first()
    if found is None or found.next_attempt_at > now:
        return None
    return int(found.id)


@dataclass(frozen=True)
class ToSend:
    """What sending one delivery needs."""

    delivery_id: int
    webhook_id: int
    attempts: int
    last_error: str | None
    url: str
    secret: str
    event: Event
    workspace: str


async def outgoing(session: AsyncSession, delivery_ids: Sequence[int]) -> list[ToSend]:
    rows = await session.execute(
        select(
            WebhookDelivery.id,
            WebhookDelivery.webhook_id,
            WebhookDelivery.attempts,
            WebhookDelivery.last_error,
            Webhook.url,
            Webhook.secret,
            Event,
            Workspace.name,
        )
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .join(Event, Event.id == WebhookDelivery.event_id)
        .join(Workspace, Workspace.id == Webhook.workspace_id)
        .where(WebhookDelivery.id.in_(delivery_ids))
        .order_by(WebhookDelivery.id)
    )
    return [ToSend(*row) for row in rows]


async def record(session: AsyncSession, delivery_id: int, outcome: Outcome) -> None:
    await session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id, _unsettled())
        .values(
            attempts=outcome.attempts,
            next_attempt_at=outcome.next_attempt_at,
            delivered_at=outcome.delivered_at,
            gave_up_at=outcome.gave_up_at,
            last_status=outcome.last_status,
            last_error=outcome.last_error,
        )
        .execution_options(synchronize_session=False)
    )


async def recent_deliveries(
    session: AsyncSession, webhook_ids: Sequence[int], per_webhook: int
) -> dict[int, list[tuple[WebhookDelivery, str]]]:
    """The latest deliveries of each webhook (newest event first), with their event's kind."""
    ranked = (
        select(
            WebhookDelivery.id,
            func.row_number()
            .over(partition_by=WebhookDelivery.webhook_id, order_by=WebhookDelivery.event_id.desc())
            .label("rank"),
        )
        .where(WebhookDelivery.webhook_id.in_(webhook_ids))
        .subquery()
    )
    rows = await session.execute(
        select(WebhookDelivery, Event.kind)
        .join(ranked, ranked.c.id == WebhookDelivery.id)
        .join(Event, Event.id == WebhookDelivery.event_id)
        .where(ranked.c.rank <= per_webhook)
        .order_by(WebhookDelivery.webhook_id, WebhookDelivery.event_id.desc())
    )
    found: dict[int, list[tuple[WebhookDelivery, str]]] = {}
    for delivery, kind in rows:
        found.setdefault(delivery.webhook_id, []).append((delivery, kind))
    return found


async def delete_settled_before(session: AsyncSession, before: datetime) -> int:
    """Deliveries delivered or given up before ``before``: deleted; how many."""
    result = await session.execute(
        delete(WebhookDelivery).where(
            or_(WebhookDelivery.delivered_at < before, WebhookDelivery.gave_up_at < before)
        )
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
