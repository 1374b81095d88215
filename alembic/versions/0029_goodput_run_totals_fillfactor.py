"""goodput_run_totals at fillfactor 50 (issue 24): a run's last row is updated every minute by
the tick, on its page (HOT), writing none of the table's indexes. Rows already written keep
their pages; the new ones leave room. Nothing on SQLite.

Revision ID: 0029
Revises: 0028
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE goodput_run_totals SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE goodput_run_totals RESET (fillfactor)")
