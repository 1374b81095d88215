"""webhook deliveries are fair across workspaces and ordered per webhook

Revision ID: 0018
Revises: 0017
"""

from collections.abc import Sequence

import sqlalchemy as sa

import backend.db
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNSETTLED = "delivered_at IS NULL AND gave_up_at IS NULL"


def upgrade() -> None:
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("sending_until", backend.db.UTCDateTime(timezone=True), nullable=True)
        )
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_webhook_deliveries_unsettled",
            ["webhook_id", "event_id"],
            unique=False,
            postgresql_where=sa.text(UNSETTLED),
            sqlite_where=sa.text(UNSETTLED),
        )


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_webhook_deliveries_unsettled",
            postgresql_where=sa.text(UNSETTLED),
            sqlite_where=sa.text(UNSETTLED),
        )
    # Not a batch: SQLite's rebuild of webhooks would cascade to every delivery; SQLite 3.35
    # and later drop a column in place.
    op.drop_column("webhooks", "sending_until")
