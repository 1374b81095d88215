from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, PortableJSON
from backend.models.base import Base, HasCreatedAt, HasId


class Run(HasId, HasCreatedAt, Base):
    """A job of one or more workers that start together (a gang); a *job* in the REST shim."""

    __tablename__ = "runs"
    __table_args__ = (
        # A name is taken while its run exists; a deleted run's name can be used again.
        Index(
            "uq_runs_workspace_id_name_live",
            "workspace_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
        Index("ix_runs_workspace_id_state", "workspace_id", "state"),
        Index("ix_runs_cluster_id_state", "cluster_id", "state"),
        # A run imported from another scheduler (a Slurm job), once per cluster.
        Index(
            "uq_runs_cluster_id_external_id",
            "cluster_id",
            "external_id",
            unique=True,
            sqlite_where=text("external_id IS NOT NULL"),
            postgresql_where=text("external_id IS NOT NULL"),
        ),
    )

    workspace_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("workspaces.id", ondelete="CASCADE")
    )
    cluster_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    # The specification exactly as accepted (normalised), what "Run again" opens.
    spec: Mapped[dict[str, Any]] = mapped_column(PortableJSON)
    priority: Mapped[int] = mapped_column(Integer)
    worker_count: Mapped[int] = mapped_column(Integer)
    gpus_per_worker: Mapped[int] = mapped_column(Integer)
    created_by_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("users.id", ondelete="SET NULL")
    )
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(1000))
    state_since: Mapped[datetime]
    # When it first ran with every worker running; its time limit counts from here.
    started_at: Mapped[datetime | None]
    # Since when every worker of the current attempt has been running.
    running_since: Mapped[datetime | None]
    # When the current attempt was placed; the gang barrier counts from here.
    placed_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    deleted_at: Mapped[datetime | None]
    # How many times the gang was placed.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Restarts after failures in a row; 10 minutes running resets it.
    failures_in_row: Mapped[int] = mapped_column(Integer, default=0)
    # Not placed again before this time (the restart backoff).
    restart_at: Mapped[datetime | None]
    # What it waits for while pending or preparing (lifecycle.states.Wait), beside the reason that
    # says it; null otherwise.
    waits_for: Mapped[str | None] = mapped_column(String(16))
    # Why the gang is being stopped: owner, time_limit, preemption, drain, stall, failure,
    # barrier.
    stop_cause: Mapped[str | None] = mapped_column(String(16))
    # Who asked, for an owner's stop; which run, for a preemption.
    stop_by: Mapped[str | None] = mapped_column(String(128))
    # The port rank 0 listens on for the gang (MASTER_PORT), chosen free per machine.
    master_port: Mapped[int | None] = mapped_column(Integer)
    # Why it failed, restarts or was preempted (lifecycle.sentences.EndCause), while its reason
    # says so: its advice is classified by it.
    cause: Mapped[str | None] = mapped_column(String(32))
    # The first failure of the current attempt: {worker, machine, reason, at}.
    first_failure: Mapped[dict[str, Any] | None] = mapped_column(PortableJSON)
    # Its id in the scheduler that runs it, when that is not Astraeus (a Slurm job id).
    external_id: Mapped[str | None] = mapped_column(String(64))
    # Its idle policy (spec.RunSpec.idle, as stored), where it has one: the runs the idle
    # check looks at, found without reading every specification (issue 41).
    idle_policy: Mapped[dict[str, Any] | None] = mapped_column(PortableJSON)
    # When its idle policy last told its workspace it was idle ("notify"); cleared once it is
    # found busy again, so that each idle spell is told once.
    idle_notified_at: Mapped[datetime | None]
    # The code it ships with (spec ``code``, a CodeArchive of its workspace), where it has
    # some; None too once the archive has passed its retention (the spec still names it).
    code_id: Mapped[int | None] = mapped_column(BigId, index=True)
