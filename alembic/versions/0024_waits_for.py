"""runs and workers keep what they wait for (runs.rules.Wait) beside the reason that says it
(issue 22: the server chose a waiting run's advice by the reason's first words); rows waiting
when this runs are backfilled from their reasons, read here once

Revision ID: 0024
Revises: 0023
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The sentences as they were written until this revision, each with what it said was waited for.
_PENDING = (
    ("No machine fits", "machines"),
    ("Gang cannot be placed whole", "machines"),
    ("Queued behind", "queue"),
    ("Next to run", "queue"),
    ("Waits for namespace quota", "queue"),
    ("Cannot plan workers", "plan"),
    ("No machine runs containers", "containers"),
)
_PREPARING = (
    ("waiting for external secret", "secret"),
    ("Waiting for drive", "drive"),
    ("Pulling image", "image"),
)


def _backfill(table: str, state: str, sentences: tuple[tuple[str, str], ...]) -> None:
    rows = sa.table(
        table,
        sa.column("state", sa.String),
        sa.column("reason", sa.String),
        sa.column("waits_for", sa.String),
    )
    for start, wait in sentences:
        op.execute(
            rows.update()
            .where(rows.c.state == state, rows.c.reason.like(f"{start}%"))
            .values(waits_for=wait)
        )


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("waits_for", sa.String(16), nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("waits_for", sa.String(16), nullable=True))
    _backfill("runs", "Pending", _PENDING)
    for table in ("runs", "workers"):
        _backfill(table, "Preparing", _PREPARING)
        _backfill(table, "Pulling", _PREPARING)


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("waits_for")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("waits_for")
