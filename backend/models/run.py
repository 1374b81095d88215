from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import BigId, PortableJSON
from backend.models.base import Base, HasCreatedAt, HasId


class Run(HasId, HasCreatedAt, Base):
    """A job of one or more workers that start together (a gang); a *job* in the REST shim."""

    __tablename__ = "runs"
    __table_args__ = (
        # A name is taken while its run exists; a deleted run's name can be used again.
        Index(
            "uq_runs_workspace_id_name_live",
            "workspace_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
        Index("ix_runs_workspace_id_state", "workspace_id", "state"),
    )

    workspace_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE")
    )
    cluster_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    # The specification exactly as accepted (normalised), what "Run again" opens.
    spec: Mapped[dict[str, Any]] = mapped_column(PortableJSON)
    priority: Mapped[int] = mapped_column(Integer)
    worker_count: Mapped[int] = mapped_column(Integer)
    gpus_per_worker: Mapped[int] = mapped_column(Integer)
    created_by_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("users.id", ondelete="SET NULL")
    )
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(1000))
    state_since: Mapped[datetime]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    deleted_at: Mapped[datetime | None]
