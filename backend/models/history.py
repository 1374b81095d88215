from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, false, text
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, PortableJSON, UTCDateTime
from backend.models.base import Base, HasId


class StateTransition(HasId, Base):
    """One state change of a run (worker_id empty) or of one of its workers, with its reason."""

    __tablename__ = "state_transitions"
    __table_args__ = (
        Index("ix_state_transitions_run_id_transition_at", "run_id", "transition_at"),
        Index("ix_state_transitions_worker_id_transition_at", "worker_id", "transition_at"),
        Index(
            "ix_state_transitions_unaccounted",
            "transition_at",
            postgresql_where=text("NOT accounted"),
            sqlite_where=text("NOT accounted"),
        ),
    )

    run_id: Mapped[int] = mapped_column(BigId, ForeignKey("runs.id", ondelete="CASCADE"))
    worker_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("workers.id", ondelete="CASCADE")
    )
    transition_at: Mapped[datetime] = mapped_column(UTCDateTime())
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(1000))
    # For a worker: the accounting phase that starts here, the GPUs it holds from here, where.
    phase: Mapped[str | None] = mapped_column(String(32))
    held_gpus: Mapped[int] = mapped_column(Integer, default=0)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    machine_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("machines.id", ondelete="SET NULL")
    )
    # Whether the goodput tick has counted the time around it. One recorded late (a stall
    # found after the fact, dated back) makes the tick count again from its time.
    accounted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Event(HasId, Base):
    """Something that happened in a workspace, kept after its run is deleted."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_workspace_id_id", "workspace_id", "id"),
        Index("ix_events_workspace_id_run_name", "workspace_id", "run_name"),
    )

    organization_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("organizations.id", ondelete="CASCADE"), index=True
    )
    # Empty for an event of the organisation's machines rather than of a workspace.
    workspace_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE")
    )
    run_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("runs.id", ondelete="SET NULL"))
    run_name: Mapped[str | None] = mapped_column(String(63))
    worker_name: Mapped[str | None] = mapped_column(String(80))
    # run.created, run.state, worker.state, run.deleted, quota, ...
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(1000))
    data: Mapped[dict[str, Any]] = mapped_column(PortableJSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
