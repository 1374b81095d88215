"""a gang stopped by a drain keeps the cause "drain" and the drained machine as who stopped it
(issue 22: the server read "drain of <machine>" back out of stop_by); runs and workers stopping
for a drain when this runs are moved over

Revision ID: 0023
Revises: 0022
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WAS = "drain of "


def upgrade() -> None:
    drained = (
        sa.select(sa.column("id"))
        .select_from(sa.table("runs"))
        .where(sa.column("stop_cause") == "preemption", sa.column("stop_by").like(f"{_WAS}%"))
    )
    runs = sa.table(
        "runs", sa.column("id"), sa.column("stop_cause", sa.String), sa.column("stop_by", sa.String)
    )
    workers = sa.table("workers", sa.column("run_id"), sa.column("stop_cause", sa.String))
    op.execute(
        workers.update()
        .where(workers.c.stop_cause == "preemption", workers.c.run_id.in_(drained))
        .values(stop_cause="drain")
    )
    op.execute(
        runs.update()
        .where(runs.c.stop_cause == "preemption", runs.c.stop_by.like(f"{_WAS}%"))
        .values(stop_cause="drain", stop_by=sa.func.substr(runs.c.stop_by, len(_WAS) + 1))
    )


def downgrade() -> None:
    runs = sa.table(
        "runs", sa.column("id"), sa.column("stop_cause", sa.String), sa.column("stop_by", sa.String)
    )
    workers = sa.table("workers", sa.column("run_id"), sa.column("stop_cause", sa.String))
    op.execute(
        workers.update().where(workers.c.stop_cause == "drain").values(stop_cause="preemption")
    )
    op.execute(
        runs.update()
        .where(runs.c.stop_cause == "drain")
        .values(stop_cause="preemption", stop_by=_WAS + runs.c.stop_by)
    )
