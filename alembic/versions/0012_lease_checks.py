"""lease checks

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import backend.db

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = backend.db.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "lease_checks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("checked_at", TIME, nullable=False),
        sa.Column("previous_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lease_checks")),
    )


def downgrade() -> None:
    op.drop_table("lease_checks")
