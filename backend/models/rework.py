from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Index, Integer
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, UTCDateTime
from backend.models.base import Base, HasId


class Redo(HasId, Base):
    """A restart of a run and the work it did again (issue 23): from ``restarted_at`` (its new
    attempt placed) until a worker's step reached ``reached_step`` again (``caught_up``) or the
    run restarted once more, ``until``. The run's productive GPU time in that span is rework.

    ``reached_step`` is the highest step the run had reported, ``checkpoint_step`` the last
    checkpoint it had reported: what it went back to. Without either the span's rework is
    unknown. Kept without foreign keys, as the ledgers' intervals it is measured on: a deleted
    run's rework stays in its workspace's figures."""

    __tablename__ = "redos"
    __table_args__ = (
        Index("ix_redos_run_id_restarted_at", "run_id", "restarted_at"),
        Index("ix_redos_workspace_id_restarted_at", "workspace_id", "restarted_at"),
    )

    run_id: Mapped[int] = mapped_column(BigId)
    workspace_id: Mapped[int] = mapped_column(BigId)
    attempt: Mapped[int] = mapped_column(Integer)
    restarted_at: Mapped[datetime] = mapped_column(UTCDateTime())
    reached_step: Mapped[int | None] = mapped_column(BigInteger)
    checkpoint_step: Mapped[int | None] = mapped_column(BigInteger)
    until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    caught_up: Mapped[bool] = mapped_column(Boolean, default=False)
