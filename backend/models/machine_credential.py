from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, false
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId
from backend.models.base import Base, HasCreatedAt, HasId


class JoinToken(HasId, HasCreatedAt, Base):
    """A token an organisation admin makes for machines to join one cluster: an agent exchanges
    it once for a credential of its own (``MachineCredential``). Stored as its SHA-256 digest.

    A legacy token is a cluster's machine token made before machines had credentials: it has no
    expiry and no bound on its uses, and may still connect directly as a machine that holds no
    credential of its own, until an admin revokes it."""

    __tablename__ = "join_tokens"

    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters of the token, to tell tokens apart in listings.
    prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128), default="")
    organization_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("organizations.id", ondelete="CASCADE"), index=True
    )
    cluster_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), index=True
    )
    # None only for a legacy token.
    expires_at: Mapped[datetime | None]
    # How many more machines may join with it; None: any number (legacy tokens only).
    uses_left: Mapped[int | None] = mapped_column(Integer)
    legacy: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class MachineCredential(HasId, HasCreatedAt, Base):
    """One machine's own credential: it registers only the machine it names, in its cluster,
    and that machine's stream carries only that machine's commands and secret values."""

    __tablename__ = "machine_credentials"
    __table_args__ = (Index("ix_machine_credentials_cluster_id_machine", "cluster_id", "machine"),)

    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    organization_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("organizations.id", ondelete="CASCADE"), index=True
    )
    cluster_id: Mapped[int] = mapped_column(BigId, ForeignKey("clusters.id", ondelete="CASCADE"))
    # The machine's name in its cluster (the machine row is made when it first says Hello).
    machine: Mapped[str] = mapped_column(String(253))
    # The join token it was made from, while that token is kept.
    join_token_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("join_tokens.id", ondelete="SET NULL"), index=True
    )
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
