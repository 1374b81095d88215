"""goodput_recounts: workers whose samples came after the tick had counted their minute

Revision ID: 0020
Revises: 0019
"""

from collections.abc import Sequence

import sqlalchemy as sa

import backend.db
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "goodput_recounts",
        sa.Column("worker_id", BIG_ID, nullable=False),
        sa.Column("since", backend.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.ForeignKeyConstraint(
            ["worker_id"],
            ["workers.id"],
            name=op.f("fk_goodput_recounts_worker_id_workers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_goodput_recounts")),
    )
    with op.batch_alter_table("goodput_recounts", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_goodput_recounts_worker_id"), ["worker_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("goodput_recounts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_goodput_recounts_worker_id"))
    op.drop_table("goodput_recounts")
