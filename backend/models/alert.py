from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, ForeignKey, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, UTCDateTime
from backend.models.base import Base, HasId


class AlertThreshold(HasId, Base):
    """A cluster's own value for one alert's threshold (its operators set it); the defaults
    of backend/alerts/rules.py hold where none is set."""

    __tablename__ = "alert_thresholds"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)

    cluster_id: Mapped[int] = mapped_column(BigId, ForeignKey("clusters.id", ondelete="CASCADE"))
    # goodput_drop.below, goodput_drop.points, goodput_drop.min_held_gpu_hours,
    # workers_stalled, runs_with_straggler, gpu_faults, slurm_import_lag (seconds)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Alert(HasId, Base):
    """One alert on one subject: firing from ``fired_at``, resolved at ``resolved_at``."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_cluster_id_resolved_at", "cluster_id", "resolved_at"),)

    cluster_id: Mapped[int] = mapped_column(BigId, ForeignKey("clusters.id", ondelete="CASCADE"))
    # The workspace it concerns (goodput_drop of a workspace, workers stalled in it); empty
    # for a pool's or the cluster's.
    workspace_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE")
    )
    # goodput_drop | workers_stalled | runs_with_straggler | gpu_faults | slurm_import_lag
    metric: Mapped[str] = mapped_column(String(32))
    # What it is about: workspace:<name>, pool:<name>, cluster:<name>.
    subject: Mapped[str] = mapped_column(String(160))
    value: Mapped[float] = mapped_column(Float)
    threshold: Mapped[float] = mapped_column(Float)
    # One sentence: why it fires.
    reason: Mapped[str] = mapped_column(String(1000))
    fired_at: Mapped[datetime] = mapped_column(UTCDateTime())
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
