"""GraphQL types of webhooks and their deliveries. A webhook's secret is shown once, in the
answer to createWebhook, and never again."""

from __future__ import annotations

from datetime import datetime, timedelta

import strawberry

from backend import ids, models
from backend.request.context import Info
from backend.schema.common import UserError
from backend.webhooks import rules

# The domain's enum, shown as it is (strawberry.enum marks the class and returns it).
DeliveryStatus = rules.DeliveryStatus
strawberry.enum(
    DeliveryStatus,
    name="WebhookDeliveryStatus",
    description="pending: not tried yet; retrying: failed, tried again at nextAttemptAt; "
    "delivered: the receiver answered 2xx; gave_up: failed 12 times.",
)


@strawberry.type(description="One event sent (or being sent) to a webhook.")
class WebhookDelivery:
    event_id: strawberry.ID = strawberry.field(
        description="The event's id, sent as X-Astraeus-Event-Id: receivers dedupe by it."
    )
    kind: str
    status: DeliveryStatus
    attempts: int = strawberry.field(description="Attempts that failed.")
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    gave_up_at: datetime | None
    last_status: int | None = strawberry.field(description="The receiver's last HTTP status.")
    last_error: str | None = strawberry.field(
        description="Why the last failed attempt failed: 'failed: HTTP 500' (the receiver's "
        f"status), 'failed' (no answer in {rules.TIMEOUT_S:g} s, or none at all) or 'refused: "
        "private address' (its host is, or resolved to, a loopback, link-local or private "
        "address)."
    )

    @classmethod
    def from_model(
        cls, row: models.WebhookDelivery, kind: str, codec: ids.IdCodec
    ) -> WebhookDelivery:
        status = rules.status(row.delivered_at, row.gave_up_at, row.attempts)
        waiting = status in (rules.DeliveryStatus.PENDING, rules.DeliveryStatus.RETRYING)
        return cls(
            event_id=strawberry.ID(codec.show(ids.Kind.EVENT, row.event_id)),
            kind=kind,
            status=status,
            attempts=row.attempts,
            next_attempt_at=row.next_attempt_at if waiting else None,
            delivered_at=row.delivered_at,
            gave_up_at=row.gave_up_at,
            last_status=row.last_status,
            last_error=row.last_error,
        )


@strawberry.type(
    description="A subscription of the workspace: its events POSTed to url as JSON, at least "
    "once and in order, retried with backoff, signed (X-Astraeus-Signature: t=<unix time>,"
    "v1=<hex HMAC-SHA256 of '<t>.<body>' with the secret>; refuse a t over "
    f"{rules.REPLAY_WINDOW // timedelta(minutes=1)} minutes old)."
)
class Webhook:
    id: strawberry.ID = strawberry.field(description="Opaque: it counts nothing.")
    url: str
    kinds: list[str] = strawberry.field(
        description="Event kinds it gets, with the kinds under them ('alert' is alert.firing "
        "and alert.resolved); empty: every kind."
    )
    created_at: datetime
    _number: strawberry.Private[int]

    @classmethod
    def from_model(cls, row: models.Webhook, codec: ids.IdCodec) -> Webhook:
        return cls(
            id=strawberry.ID(codec.show(ids.Kind.WEBHOOK, row.id)),
            _number=row.id,
            url=row.url,
            kinds=list(row.kinds),
            created_at=row.created_at,
        )

    @strawberry.field(description="Its latest deliveries, newest event first (20 at most).")
    async def deliveries(self, info: Info) -> list[WebhookDelivery]:
        rows = await info.context.loaders.webhook_deliveries.load(self._number)
        codec = await ids.codec(info.context.db)
        return [WebhookDelivery.from_model(d, kind, codec) for d, kind in rows]


@strawberry.type
class CreateWebhookPayload:
    webhook: Webhook | None
    secret: str | None = strawberry.field(
        description="The key of the signatures. Shown only here: keep it now."
    )
    errors: list[UserError]


@strawberry.type
class WebhookPayload:
    webhook: Webhook | None
    errors: list[UserError]
