from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.db import BigId, PortableJSON
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
