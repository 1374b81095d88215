"""rework (issue 23): workers keep the highest step they reported, their last checkpoint and, after
a restart, the step they must reach again; each restart of a run is a redo, the span its
productive time is rework in

Revision ID: 0026
Revises: 0025
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_WORKER_COLUMNS = ("reached_step", "checkpoint_step", "redo_until")


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        for name in _WORKER_COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))
    op.create_table(
        "redos",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("workspace_id", _ID, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("restarted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reached_step", sa.BigInteger(), nullable=True),
        sa.Column("checkpoint_step", sa.BigInteger(), nullable=True),
        sa.Column("until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("caught_up", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_redos_run_id_restarted_at", "redos", ["run_id", "restarted_at"])
    op.create_index(
        "ix_redos_workspace_id_restarted_at", "redos", ["workspace_id", "restarted_at"]
    )


def downgrade() -> None:
    op.drop_table("redos")
    with op.batch_alter_table("workers") as batch:
        for name in _WORKER_COLUMNS:
            batch.drop_column(name)
