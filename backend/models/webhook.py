from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from backend.crypto import EncryptedText
from backend.db.types import BigId, PortableJSON, UTCDateTime
from backend.models.base import Base, HasCreatedAt, HasId


class Webhook(HasId, HasCreatedAt, Base):
    """A workspace's subscription: its events are POSTed to ``url``, signed with ``secret``.

    The secret is kept encrypted (the server signs with it) and shown once, when created.
    Events become deliveries in id order: every event up to ``cursor`` has been looked at.
    Ids are handed out before their transactions commit, so on PostgreSQL a smaller id can
    become visible after a larger one; the cursor therefore only moves up to ``horizon``, the
    highest id looked at by a pass at ``horizon_at``, once that is old enough for every
    transaction open then to have ended (backend/webhooks/rules.py ``advance``)."""

    __tablename__ = "webhooks"

    workspace_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )
    url: Mapped[str] = mapped_column(String(2048))
    # Encrypted at rest (backend/crypto.py).
    secret: Mapped[str] = mapped_column(EncryptedText())
    # Event kind prefixes ("alert" is alert.firing and alert.resolved); empty: every kind.
    kinds: Mapped[list[str]] = mapped_column(PortableJSON, default=list)
    # Deleted: nothing more is handed to it or sent.
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cursor: Mapped[int] = mapped_column(BigId, default=0)
    horizon: Mapped[int] = mapped_column(BigId, default=0)
    horizon_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # A pass is sending its deliveries, one at a time, until then (one in flight per webhook;
    # a pass that died leaves it to the next once it is past).
    sending_until: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebhookDelivery(HasId, HasCreatedAt, Base):
    """One event for one webhook: sent until a 2xx answer, or given up after 12 attempts."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("webhook_id", "event_id"),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text("delivered_at IS NULL AND gave_up_at IS NULL"),
            sqlite_where=text("delivered_at IS NULL AND gave_up_at IS NULL"),
        ),
        # Each webhook's oldest unsettled delivery: the one it sends next.
        Index(
            "ix_webhook_deliveries_unsettled",
            "webhook_id",
            "event_id",
            postgresql_where=text("delivered_at IS NULL AND gave_up_at IS NULL"),
            sqlite_where=text("delivered_at IS NULL AND gave_up_at IS NULL"),
        ),
    )

    webhook_id: Mapped[int] = mapped_column(BigId, ForeignKey("webhooks.id", ondelete="CASCADE"))
    event_id: Mapped[int] = mapped_column(BigId, ForeignKey("events.id", ondelete="CASCADE"))
    # Attempts that failed (a 2xx is not counted as one).
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When it is next sent; while a pass is sending it, the end of that pass's claim.
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    gave_up_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The receiver's last HTTP status, if it answered; why the last attempt failed, if it did.
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(1000))
