"""checkpoints: each checkpoint a worker reported and what it cost, for the checkpoint advice
(issue 41)

Revision ID: 0038
Revises: 0037
"""

from collections.abc import Sequence

import sqlalchemy as sa

import backend.db
from alembic import op

revision: str = "0038"
down_revision: str | None = "0037"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("run_id", BIG_ID, nullable=False),
        sa.Column("worker_id", BIG_ID, nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("at", backend.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("cost_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
    )
    op.create_index("ix_checkpoints_run_id_at", "checkpoints", ["run_id", "at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_checkpoints_run_id_at", table_name="checkpoints")
    op.drop_table("checkpoints")
