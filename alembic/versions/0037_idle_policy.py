"""Idle policies (issue 41): each run's policy out of its specification, when its workspace was
last told it idles, a pool's default policy, and what the policies did (idle_actions)

Revision ID: 0037
Revises: 0036
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

import backend.db
from alembic import op

revision: str = "0037"
down_revision: str | None = "0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idle_policy", _JSON, nullable=True))
        batch_op.add_column(
            sa.Column("idle_notified_at", backend.db.UTCDateTime(timezone=True), nullable=True)
        )
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idle_policy", _JSON, nullable=True))
    op.create_table(
        "idle_actions",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("run_id", BIG_ID, nullable=False),
        sa.Column("workspace_id", BIG_ID, nullable=False),
        sa.Column("run_name", sa.String(length=63), nullable=False),
        sa.Column("action", sa.String(length=8), nullable=False),
        sa.Column("at", backend.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("idle_since", backend.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("below", sa.Float(), nullable=False),
        sa.Column("window_s", sa.Integer(), nullable=False),
        sa.Column("limit_at", backend.db.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idle_actions")),
    )
    op.create_index(
        "ix_idle_actions_workspace_id_at", "idle_actions", ["workspace_id", "at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_idle_actions_workspace_id_at", table_name="idle_actions")
    op.drop_table("idle_actions")
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.drop_column("idle_policy")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("idle_notified_at")
        batch_op.drop_column("idle_policy")
