"""goodput run totals

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from alembic import op

import backend.db

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = backend.db.UTCDateTime(timezone=True)
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# rules.CATEGORIES as this revision knows them
CATEGORIES = (
    "productive", "idle", "stalled", "starting", "restart", "failure", "preemption", "waiting"
)
COLUMNS = [f"{c}_{part}" for part in ("held", "not_held") for c in CATEGORIES]
HOUR = timedelta(hours=1)


def upgrade() -> None:
    op.create_table(
        "goodput_run_totals",
        sa.Column("run_id", ID, autoincrement=False, nullable=False),
        sa.Column("hour", TIME, nullable=False),
        sa.Column("workspace_id", ID, nullable=False),
        sa.Column("cluster_id", ID, nullable=False),
        sa.Column("last", sa.Boolean(), nullable=False),
        *(sa.Column(c, sa.Float(), nullable=False) for c in COLUMNS),
        sa.PrimaryKeyConstraint("run_id", "hour", name=op.f("pk_goodput_run_totals")),
    )
    op.create_index(
        "ix_goodput_run_totals_hour_workspace_id",
        "goodput_run_totals",
        ["hour", "workspace_id"],
    )
    last = sa.text("last")
    for name, column in (("run_id", "run_id"), ("hour", "hour")):
        op.create_index(
            f"ix_goodput_run_totals_last_{name}",
            "goodput_run_totals",
            [column],
            postgresql_where=last,
            sqlite_where=last,
        )
    _totals_from_hours()


def _totals_from_hours() -> None:
    """The running totals of the runs counted before this table existed: every hour from a
    run's first cell to its last, each the hour before plus its cells."""
    hours = sa.table(
        "goodput_hours",
        sa.column("hour", TIME),
        *(sa.column(c) for c in ("workspace_id", "cluster_id", "scope", "scope_id", "category",
                                 "held", "gpu_seconds")),
    )
    bind = op.get_bind()
    cells: dict[int, dict[datetime, list[float]]] = {}  # by run, by hour
    owner: dict[int, tuple[int, int]] = {}
    query = sa.select(hours).where(hours.c.scope == "run")
    for row in bind.execute(query):
        hour = row.hour
        column = COLUMNS.index(f"{row.category}_{'held' if row.held else 'not_held'}")
        sums = cells.setdefault(row.scope_id, {}).setdefault(hour, [0.0] * len(COLUMNS))
        sums[column] += row.gpu_seconds
        owner[row.scope_id] = (row.workspace_id, row.cluster_id)
    target = sa.table(
        "goodput_run_totals",
        sa.column("run_id"), sa.column("hour", TIME), sa.column("workspace_id"),
        sa.column("cluster_id"), sa.column("last"), *(sa.column(c) for c in COLUMNS),
    )
    rows = []
    for run_id, by_hour in cells.items():
        total = [0.0] * len(COLUMNS)
        hour, final = min(by_hour), max(by_hour)
        while hour <= final:
            sums = by_hour.get(hour)  # none: an hour without cells repeats the one before
            if sums is not None:
                total = [t + s for t, s in zip(total, sums, strict=True)]
            workspace, cluster = owner[run_id]
            rows.append({
                "run_id": run_id, "hour": hour, "workspace_id": workspace, "cluster_id": cluster,
                "last": hour == final, **dict(zip(COLUMNS, total, strict=True)),
            })
            hour += HOUR
            if len(rows) >= 10_000:
                bind.execute(target.insert(), rows)
                rows = []
    if rows:
        bind.execute(target.insert(), rows)


def downgrade() -> None:
    op.drop_table("goodput_run_totals")
