from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, UTCDateTime
from backend.models.base import Base, HasId


class IdleAction(HasId, Base):
    """What a run's idle policy did (issue 41): ``stop`` (the run was stopped) or ``notify`` (its
    workspace was told), at ``at``, every GPU of its ``gpus`` under ``below`` (0 to 1) each
    minute since ``idle_since`` (``window_s`` before the minute it was found). ``limit_at`` is
    when its time limit would have stopped it anyway (what a stop gave back ends there). Kept
    without foreign keys, as the rework's spans: a deleted run's stop stays in its workspace's
    figures."""

    __tablename__ = "idle_actions"
    __table_args__ = (Index("ix_idle_actions_workspace_id_at", "workspace_id", "at"),)

    run_id: Mapped[int] = mapped_column(BigId)
    workspace_id: Mapped[int] = mapped_column(BigId)
    run_name: Mapped[str] = mapped_column(String(63))
    action: Mapped[str] = mapped_column(String(8))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    idle_since: Mapped[datetime] = mapped_column(UTCDateTime())
    gpus: Mapped[int] = mapped_column(Integer)
    below: Mapped[float] = mapped_column(Float)
    window_s: Mapped[int] = mapped_column(Integer)
    limit_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
