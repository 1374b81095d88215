from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId
from backend.models.base import Base, HasCreatedAt, HasId


class User(HasId, HasCreatedAt, Base):
    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(128), unique=True)


class Membership(HasId, HasCreatedAt, Base):
    """A user's place in an organisation: a member of one workspace, or an org admin."""

    __tablename__ = "memberships"
    __table_args__ = (UniqueConstraint("user_id", "organization_id", "workspace_id"),)

    user_id: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"))
    organization_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("organizations.id", ondelete="CASCADE"), index=True
    )
    # None for an organisation admin, who sees every workspace of the organisation.
    workspace_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )
    # member | org_admin
    role: Mapped[str] = mapped_column(String(16))


class ApiToken(HasId, HasCreatedAt, Base):
    """A bearer token, stored as its SHA-256 digest; the secret is shown once."""

    __tablename__ = "api_tokens"

    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters of the token, to tell tokens apart in listings.
    prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128), default="")
    # user: a person or a script acting in a workspace; agent: a machine's agent on a cluster.
    kind: Mapped[str] = mapped_column(String(16), default="user")
    user_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    organization_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("organizations.id", ondelete="CASCADE"), index=True
    )
    workspace_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )
    cluster_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), index=True
    )
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    # None: never expires. A token is refused from this time on.
    expires_at: Mapped[datetime | None]
