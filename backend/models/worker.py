from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, PortableJSON
from backend.models.base import Base, HasCreatedAt, HasId


class Worker(HasId, HasCreatedAt, Base):
    """One rank of a run, named ``<run>-<rank>``; a *task* in the REST shim."""

    __tablename__ = "workers"
    __table_args__ = (UniqueConstraint("run_id", "rank"),)

    run_id: Mapped[int] = mapped_column(BigId, ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(80), index=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(1000))
    state_since: Mapped[datetime]
    machine_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("machines.id", ondelete="SET NULL"), index=True
    )
    # Indexes of the machine's GPUs this worker holds while placed.
    gpu_ids: Mapped[list[int]] = mapped_column(PortableJSON, default=list)
    gpus: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    restart_at: Mapped[datetime | None]
    exit_code: Mapped[int | None] = mapped_column(Integer)
    # How its last attempt ended (lifecycle.sentences.EndCause): its failure is classified by it.
    cause: Mapped[str | None] = mapped_column(String(32))
    # {reason, failed_at, exit_code, log_tail}: the last failure snapshot, kept across restarts.
    last_failure: Mapped[dict[str, Any] | None] = mapped_column(PortableJSON)
    # At the gang barrier: prepared and pulled, waiting for the others.
    ready: Mapped[bool] = mapped_column(Boolean, default=False)
    # What it waits for while preparing or pulling (lifecycle.states.Wait), as its agent said.
    waits_for: Mapped[str | None] = mapped_column(String(16))
    # Why it is being stopped, while it still holds its GPUs (see Run.stop_cause).
    stop_cause: Mapped[str | None] = mapped_column(String(16))
    # The accounting phase it is in now; each transition records the phase it starts.
    phase: Mapped[str] = mapped_column(String(32), default="waiting")
    # The last sign of progress (a progress report or a new log line) while running.
    progress_at: Mapped[datetime | None]
    # Set while it is stalled: from when it stopped making progress.
    stalled_since: Mapped[datetime | None]
    # The workload's last reported step, when, and its pace (steps per second, smoothed).
    progress_step: Mapped[int | None] = mapped_column(BigInteger)
    stepped_at: Mapped[datetime | None]
    progress_rate: Mapped[float | None] = mapped_column(Float)
    # The highest step it ever reported and its last reported checkpoint, over all its attempts,
    # and after a restart the step it must reach again before its work is new (issue 23).
    reached_step: Mapped[int | None] = mapped_column(BigInteger)
    checkpoint_step: Mapped[int | None] = mapped_column(BigInteger)
    redo_until: Mapped[int | None] = mapped_column(BigInteger)
    # Its GPUs' recent mean utilisation (0 to 1), from its agent's samples: the pace of a worker
    # that reports no progress, for straggler detection.
    gpu_utilization: Mapped[float | None] = mapped_column(Float)
    # Since when it has been well behind its gang's median pace (a straggler after 3 minutes).
    slow_since: Mapped[datetime | None]


class Attempt(HasId, Base):
    """One placement of a worker: a container (or process) from start to end."""

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("worker_id", "number"),)

    worker_id: Mapped[int] = mapped_column(BigId, ForeignKey("workers.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    machine_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("machines.id", ondelete="SET NULL"), index=True
    )
    gpu_ids: Mapped[list[int]] = mapped_column(PortableJSON, default=list)
    placed_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(1000), default="")
