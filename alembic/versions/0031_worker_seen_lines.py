"""A worker's last lines the server relayed from its machine (issue 36): the failure snapshot
of a worker whose machine is lost, its agent's own copies gone with it

Revision ID: 0031
Revises: 0030
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "worker_seen_lines",
        sa.Column(
            "worker_id",
            _ID,
            sa.ForeignKey("workers.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("machine_id", _ID, nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_worker_seen_lines_machine_id", "worker_seen_lines", ["machine_id"])


def downgrade() -> None:
    op.drop_index("ix_worker_seen_lines_machine_id", "worker_seen_lines")
    op.drop_table("worker_seen_lines")
