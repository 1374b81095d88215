from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, Index
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, UTCDateTime
from backend.models.base import Base, HasId


class Checkpoint(HasId, Base):
    """A checkpoint a worker reported (its progress's ``checkpoint_step`` moved on, issue 41) at
    ``at``, and what it cost: ``cost_s``, the pause in its steps around it (the time since its
    previous step report less what its steps took at its pace); None where its pace was not
    known yet. Kept without foreign keys, as the rework's spans."""

    __tablename__ = "checkpoints"
    __table_args__ = (Index("ix_checkpoints_run_id_at", "run_id", "at"),)

    run_id: Mapped[int] = mapped_column(BigId)
    worker_id: Mapped[int] = mapped_column(BigId)
    step: Mapped[int] = mapped_column(BigInteger)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    cost_s: Mapped[float | None] = mapped_column(Float)
