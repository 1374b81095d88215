from __future__ import annotations

from typing import Any

from sqlalchemy import Boolean, Float, ForeignKey, String, UniqueConstraint, false
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, PortableJSON
from backend.models.base import Base, HasCreatedAt, HasId


class Cluster(HasId, HasCreatedAt, Base):
    """A set of machines run by one organisation; quotas and thresholds are per cluster."""

    __tablename__ = "clusters"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)

    organization_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("organizations.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    # The admins' policy: may a higher-priority run preempt a run of another workspace that
    # holds more than its quota here? Without it, runs preempt only their own workspace's.
    preempt_over_quota: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # A cluster run by Slurm (issue 25): how its client commands reach slurmctld and slurmdbd
    # ({"conf": the slurm.conf path, "bin": the folder of the commands, "timeout_s"}); None for
    # a cluster Astraeus schedules itself.
    slurm: Mapped[dict[str, Any] | None] = mapped_column(PortableJSON)


class Pool(HasId, HasCreatedAt, Base):
    """A named group of a cluster's machines (for example by GPU model)."""

    __tablename__ = "pools"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)

    cluster_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    # What a GPU-hour of its machines costs (issue 23), as its organisation's admins set it, in
    # ``currency`` (ISO 4217); None: no price, its GPU time has no cost.
    gpu_hour_price: Mapped[float | None] = mapped_column(Float)
    currency: Mapped[str | None] = mapped_column(String(3))
    # The idle policy a run submitted to this pool without one of its own takes (issue 41), as
    # its organisation's admins set it (spec.IdlePolicy's JSON); None: none.
    idle_policy: Mapped[dict[str, Any] | None] = mapped_column(PortableJSON)
