from __future__ import annotations

from sqlalchemy import BigInteger, Float, ForeignKey, Index, PrimaryKeyConstraint, SmallInteger
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.types import BigId
from backend.models.base import Base


def _sample_table_args(table: str) -> tuple[object, ...]:
    """The one B-tree of a sample table is its primary key, which does two jobs.

    It makes a resent sample (same worker, metric, GPU and time) a duplicate the insert skips,
    and it is the covering index every range query reads: on PostgreSQL ``INCLUDE (value)``
    makes the scan index-only (PERFORMANCE.md: 40-260x faster cold than visiting the heap); on
    SQLite the table is stored ``WITHOUT ROWID``, clustered on that key with the value beside
    it. A second, BRIN (block range) index on ``ts`` lets pruning find old rows without a scan
    of the whole table; samples arrive in time order, so a few summaries per thousand pages
    describe it. SQLite has no BRIN and gets a plain index, which at the embedded mode's size
    costs nothing worth counting.
    """
    return (
        PrimaryKeyConstraint("worker_id", "metric", "gpu", "ts", postgresql_include=["value"]),
        Index(f"ix_{table}_ts", "ts", postgresql_using="brin"),
        {"sqlite_with_rowid": False},
    )


class _Sample:
    """The columns of a sample. The 8-byte columns come first so PostgreSQL pads no row."""

    worker_id: Mapped[int] = mapped_column(BigId, ForeignKey("workers.id", ondelete="CASCADE"))
    # Epoch milliseconds (STYLE.md), as the agent sent them.
    ts: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float] = mapped_column(Float)
    # The machine the worker ran on when sampled: a worker moves between attempts, and `by`
    # machine needs the machine of the moment. No foreign key: that check would cost every
    # sample an index probe, and a removed machine's samples simply age out.
    machine_id: Mapped[int] = mapped_column(BigId)
    # The metric's id in backend/metrics/rules.py's catalogue.
    metric: Mapped[int] = mapped_column(SmallInteger)
    # The GPU index for per-GPU metrics, -1 for the worker's own. Never NULL: NULLs are distinct
    # in a key, so a NULL here would let a resent worker sample in twice.
    gpu: Mapped[int] = mapped_column(SmallInteger)


class MetricSample(_Sample, Base):
    """One value of one metric of one worker (and GPU), as its machine sampled it."""

    __tablename__ = "metric_samples"
    __table_args__ = _sample_table_args(__tablename__)


class MetricMinute(_Sample, Base):
    """A one-minute summary of samples older than the raw retention (the pruning job writes it):
    the mean of a gauge, the last (highest) value of a counter, at the minute's start."""

    __tablename__ = "metric_minutes"
    __table_args__ = _sample_table_args(__tablename__)
