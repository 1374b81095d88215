from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, UTCDateTime
from backend.models.base import Base, HasId


class WorkerFailure(HasId, Base):
    """An attempt of a worker that failed (or stalled) on a machine: its cause (an EndCause)
    and exit code, for the machines' health over time (issue 23: lemon machines). Kept without
    foreign keys, as the ledgers: a deleted run's failures still count against the machine."""

    __tablename__ = "worker_failures"
    __table_args__ = (Index("ix_worker_failures_machine_id_at", "machine_id", "at"),)

    machine_id: Mapped[int] = mapped_column(BigId)
    cluster_id: Mapped[int] = mapped_column(BigId)
    workspace_id: Mapped[int] = mapped_column(BigId)
    run_id: Mapped[int] = mapped_column(BigId)
    worker_id: Mapped[int] = mapped_column(BigId)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    cause: Mapped[str] = mapped_column(String(32))
    exit_code: Mapped[int | None] = mapped_column(Integer)


class GpuFault(HasId, Base):
    """A GPU fault its machine's agent reported (an XID, uncorrectable ECC errors, a row
    remapping pending or failed): what the GPU's health said then, kept over time."""

    __tablename__ = "gpu_faults"
    __table_args__ = (Index("ix_gpu_faults_machine_id_at", "machine_id", "at"),)

    machine_id: Mapped[int] = mapped_column(BigId)
    gpu_index: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    kind: Mapped[str] = mapped_column(String(16))  # xid | ecc | remap | other
    reason: Mapped[str] = mapped_column(String(1000))


class WorkerSeenLines(Base):
    """A worker's last lines the server relayed from its machine (a log read or followed while
    it ran), at most 50 and 16 KiB: a lost machine's workers' failure snapshots are made of them
    (issue 36; seed L-21), since their agent's own copies are gone with the machine. Logs are
    kept on the machines (seed L-3): this is the snapshot's, kept while the attempt runs and
    dropped when it ends, when the machine's agent says Hello again, or when its machine is lost
    (taken into the snapshots)."""

    __tablename__ = "worker_seen_lines"

    worker_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("workers.id", ondelete="CASCADE"), primary_key=True
    )
    machine_id: Mapped[int] = mapped_column(BigId, index=True)
    text: Mapped[str] = mapped_column(Text)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
