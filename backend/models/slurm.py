from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, PortableJSON
from backend.models.base import Base, HasCreatedAt, HasId


class SlurmAccount(HasId, HasCreatedAt, Base):
    """A Slurm account of a Slurm-backed cluster and the workspace its jobs are imported into,
    as the organisation's admins mapped it (issue 25). A job of an account without a mapping
    is not imported: its account is listed as unmapped in the cluster's import status."""

    __tablename__ = "slurm_accounts"
    __table_args__ = (UniqueConstraint("cluster_id", "account"),)

    cluster_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), index=True
    )
    account: Mapped[str] = mapped_column(String(64))
    workspace_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )


class SlurmImport(Base):
    """Where a Slurm-backed cluster's import stands (one row per cluster): since when its
    accounting is read, when it last read it, what went wrong the last time, the accounts of
    jobs it saw without a workspace, and the records it could not read."""

    __tablename__ = "slurm_imports"

    cluster_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True
    )
    # Jobs active at or after this time are read (sacct's --starttime); moved forward to the
    # start of each successful import, less a margin.
    since: Mapped[datetime]
    imported_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(String(1000))
    error_at: Mapped[datetime | None]
    # account -> number of jobs seen in the last import without a mapped workspace
    unmapped: Mapped[dict[str, Any]] = mapped_column(PortableJSON, default=dict)
    # record -> why, of what the last import's commands printed and it could not read (a job,
    # a node: set aside, the others imported; issue 38)
    quarantined: Mapped[dict[str, Any]] = mapped_column(PortableJSON, default=dict)


class SlurmRun(Base):
    """The Slurm job that runs a run, kept apart from the run's specification (the user's,
    what Run again submits; issue 38): the job's id, whether Astraeus submitted it or imported
    it, what Slurm says of it (shown wherever the run is), and how far the import has written
    its life."""

    __tablename__ = "slurm_runs"

    run_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    job_id: Mapped[str] = mapped_column(String(64))
    # Submitted from Astraeus (its specification is a run's: it can run again); else imported
    submitted: Mapped[bool]
    job_name: Mapped[str] = mapped_column(String(256), default="")
    account: Mapped[str] = mapped_column(String(64), default="")
    user: Mapped[str] = mapped_column(String(64), default="")
    partition: Mapped[str] = mapped_column(String(64), default="")
    qos: Mapped[str] = mapped_column(String(64), default="")
    priority: Mapped[int | None] = mapped_column(BigInteger)  # Slurm's own
    # Who cancelled the job, as Slurm's accounting names them (None: not cancelled)
    cancelled_by: Mapped[str | None] = mapped_column(String(64))
    # How many of the job's changes (backend/slurm/rules.changes) its run has taken (None: a
    # run imported before it was kept)
    applied: Mapped[int | None] = mapped_column(Integer)
