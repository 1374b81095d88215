"""a price per GPU-hour for each pool, in a currency (issue 23: cost), set by the organisation's
admins; none by default

Revision ID: 0028
Revises: 0027
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pools") as batch:
        batch.add_column(sa.Column("gpu_hour_price", sa.Float(), nullable=True))
        batch.add_column(sa.Column("currency", sa.String(3), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pools") as batch:
        batch.drop_column("currency")
        batch.drop_column("gpu_hour_price")
