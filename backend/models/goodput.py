from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId, UTCDateTime
from backend.models.base import Base, HasId


class AccountingMark(Base):
    """How far the goodput tick has counted: every worker's time before ``counted_until``."""

    __tablename__ = "accounting_marks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    counted_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ticked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class GoodputRecount(HasId, Base):
    """A worker's samples that came after the tick had counted their minute (its agent kept
    them while the server was away): the tick counts the worker again from ``since``, as it
    does for a stall found late, and deletes the row. Written with the samples."""

    __tablename__ = "goodput_recounts"

    worker_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("workers.id", ondelete="CASCADE"), index=True
    )
    since: Mapped[datetime] = mapped_column(UTCDateTime())


class GoodputHorizon(Base):
    """A Slurm-backed cluster whose import is behind (its last read older than
    ``rules.IMPORT_BEHIND`` before what the tick counts): the tick counts the cluster's Slurm
    jobs no further than ``counted_to``, the import's last read, and counts them again from
    there when it has read on (issue 38 F3). Written by the tick only; no row: not behind."""

    __tablename__ = "goodput_horizons"

    cluster_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True
    )
    counted_to: Mapped[datetime] = mapped_column(UTCDateTime())


class GoodputInterval(HasId, Base):
    """Part of a worker's GPU time in one category: what a ledger figure is made of.

    Kept without foreign keys: the ledgers and their explanation outlive a deleted run's
    workers (the names are kept here for that)."""

    __tablename__ = "goodput_intervals"
    __table_args__ = (
        Index("ix_goodput_intervals_end_at", "end_at"),
        Index("ix_goodput_intervals_worker_id_end_at", "worker_id", "end_at"),
        Index("ix_goodput_intervals_workspace_id_start_at", "workspace_id", "start_at"),
        Index("ix_goodput_intervals_run_id_start_at", "run_id", "start_at"),
        Index("ix_goodput_intervals_machine_id_start_at", "machine_id", "start_at"),
    )

    worker_id: Mapped[int] = mapped_column(BigId)
    worker_name: Mapped[str] = mapped_column(String(80))
    run_id: Mapped[int] = mapped_column(BigId)
    workspace_id: Mapped[int] = mapped_column(BigId)
    cluster_id: Mapped[int] = mapped_column(BigId)
    machine_id: Mapped[int | None] = mapped_column(BigId)
    pool_id: Mapped[int | None] = mapped_column(BigId)
    start_at: Mapped[datetime] = mapped_column(UTCDateTime())
    end_at: Mapped[datetime] = mapped_column(UTCDateTime())
    category: Mapped[str] = mapped_column(String(16))
    held: Mapped[bool] = mapped_column(Boolean)
    gpus: Mapped[int] = mapped_column(Integer)


class _Cell:
    """A ledger cell's key (but its time) and its GPU-seconds."""

    workspace_id: Mapped[int] = mapped_column(BigId)
    # The cluster the time was spent on: organisation admins read a cluster's ledgers.
    cluster_id: Mapped[int] = mapped_column(BigId)
    scope: Mapped[str] = mapped_column(String(16))
    scope_id: Mapped[int] = mapped_column(BigId)
    category: Mapped[str] = mapped_column(String(16))
    held: Mapped[bool] = mapped_column(Boolean)
    gpu_seconds: Mapped[float] = mapped_column(Float)


class GoodputHour(HasId, _Cell, Base):
    """GPU-seconds of one UTC hour, scope (run, machine, pool, workspace), category and held,
    per workspace: a workspace's token reads its own share of a machine or a pool."""

    __tablename__ = "goodput_hours"
    __table_args__ = (
        UniqueConstraint(
            "hour",
            "workspace_id",
            "cluster_id",
            "scope",
            "scope_id",
            "category",
            "held",
            name="uq_goodput_hours_cell",
        ),
        Index("ix_goodput_hours_scope_hour", "scope", "hour"),
    )

    hour: Mapped[datetime] = mapped_column(UTCDateTime())


class GoodputDay(HasId, _Cell, Base):
    """The same cells summed by UTC day, kept beside the hours by the tick: a week by run reads
    seven rows of a run's cell instead of 168."""

    __tablename__ = "goodput_days"
    __table_args__ = (
        UniqueConstraint(
            "day",
            "workspace_id",
            "cluster_id",
            "scope",
            "scope_id",
            "category",
            "held",
            name="uq_goodput_days_cell",
        ),
        Index("ix_goodput_days_scope_day", "scope", "day"),
    )

    day: Mapped[datetime] = mapped_column(UTCDateTime())


class GoodputOpenInterval(Base):
    """A live worker as the tick last counted it: the phase in force at the tick's mark (from
    the transitions it counted), and the interval it is in, still open.

    The open interval ends where the tick's mark is (accounting_marks.counted_until): a worker
    that stays in one category costs the tick no write but its ledger cells. It moves to
    goodput_intervals when its category, machine, pool or UTC hour changes, or the worker ends.
    Updated in place every few minutes: kept at fillfactor 50, without other indexes, so the
    updates stay on their page (HOT)."""

    __tablename__ = "goodput_open_intervals"
    __table_args__ = ({"postgresql_with": {"fillfactor": 50}},)

    worker_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    worker_name: Mapped[str] = mapped_column(String(80))
    run_id: Mapped[int] = mapped_column(BigId)
    workspace_id: Mapped[int] = mapped_column(BigId)
    cluster_id: Mapped[int] = mapped_column(BigId)
    # The phase in force, with the GPUs it asks for and the machine it is on.
    phase: Mapped[str] = mapped_column(String(32))
    gpus: Mapped[int] = mapped_column(Integer)
    phase_machine_id: Mapped[int | None] = mapped_column(BigId)
    # The open interval: from start_at to the mark.
    start_at: Mapped[datetime] = mapped_column(UTCDateTime())
    category: Mapped[str] = mapped_column(String(16))
    held: Mapped[bool] = mapped_column(Boolean)
    machine_id: Mapped[int | None] = mapped_column(BigId)
    pool_id: Mapped[int | None] = mapped_column(BigId)


# The goodput categories' values, in the order of accounting.rules.CATEGORIES (a report reads
# the columns so; tests/accounting/test_total_columns.py holds the two equal). Written here,
# not imported: a table names its columns, and the models import no domain.
CATEGORY_VALUES = (
    "productive", "idle", "stalled", "starting", "restart", "failure", "preemption", "waiting"
)  # fmt: skip
# A run's running totals keep one column for each category's time held, then one for each
# category's time not held.
TOTAL_COLUMNS = tuple(
    f"{category}_{part}" for part in ("held", "not_held") for category in CATEGORY_VALUES
)


class GoodputRunTotal(Base):
    """A run's GPU-seconds from its first counted hour to the end of ``hour``, by category,
    held and not held: what its hourly cells add up to so far.

    A run has one row for every hour from its first cell's to its last cell's, none skipped
    (an hour without cells repeats the one before), and ``last`` marks the latest. Its time in
    any whole hours [start, end) is then two rows apart: the row at end - 1 h (or its last
    row, if it ended before) less the row at start - 1 h. A 7-day report over 10 000 runs
    reads 20 000 rows instead of 10 000 x 168 x its categories. The tick keeps the rows up
    to date from the hourly cells it writes (ledger_writes.refresh_run_totals), recomputing
    every hour from the earliest it changed; a minute of workers without a change is added to
    each run's last row (ledger_writes.count_steady_minute). That row is updated every minute:
    kept at fillfactor 50, so the update stays on its page (HOT) and writes none of the four
    indexes (100 000 runs: 0.4 s a minute against 1.3 s, 28 MB of WAL against 92 MB; the cost
    is twice the pages)."""

    __table__ = Table(
        "goodput_run_totals",
        Base.metadata,
        Column("run_id", BigId, primary_key=True, autoincrement=False),
        Column("hour", UTCDateTime(), primary_key=True),
        Column("workspace_id", BigId, nullable=False),
        Column("cluster_id", BigId, nullable=False),
        Column("last", Boolean, nullable=False),
        *(Column(name, Float, nullable=False) for name in TOTAL_COLUMNS),
        Index("ix_goodput_run_totals_hour_workspace_id", "hour", "workspace_id"),
        # the latest row of each run: found by run (the tick) and by hour (a run that ended)
        Index(
            "ix_goodput_run_totals_last_run_id",
            "run_id",
            postgresql_where=text("last"),
            sqlite_where=text("last"),
        ),
        Index(
            "ix_goodput_run_totals_last_hour",
            "hour",
            postgresql_where=text("last"),
            sqlite_where=text("last"),
        ),
        postgresql_with={"fillfactor": 50},
    )
