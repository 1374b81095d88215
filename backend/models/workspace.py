from __future__ import annotations

from sqlalchemy import ForeignKey, Integer, String, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId
from backend.models.base import Base, HasCreatedAt, HasId

DEFAULT_PRIORITY_CEILING = 50  # a run's default priority: members may not go above it


class Workspace(HasId, HasCreatedAt, Base):
    """A team's space: its runs, its tokens, its share of the clusters' GPUs."""

    __tablename__ = "workspaces"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)

    organization_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("organizations.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    # The highest priority its members may give a run; its organisation's admins set it.
    priority_ceiling: Mapped[int] = mapped_column(
        Integer,
        default=DEFAULT_PRIORITY_CEILING,
        server_default=text(str(DEFAULT_PRIORITY_CEILING)),
    )


class WorkspaceQuota(HasId, Base):
    """The most GPUs a workspace's runs may hold at once on one cluster."""

    __tablename__ = "workspace_quotas"
    __table_args__ = (UniqueConstraint("workspace_id", "cluster_id"),)

    workspace_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )
    cluster_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), index=True
    )
    gpus: Mapped[int] = mapped_column(Integer)
