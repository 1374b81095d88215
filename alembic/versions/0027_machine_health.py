"""machines' health over time (issue 23: lemon machines): each failed (or stalled) attempt of a
worker on a machine, with its cause and exit code, and each GPU fault an agent reported

Revision ID: 0027
Revises: 0026
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "worker_failures",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("machine_id", _ID, nullable=False),
        sa.Column("cluster_id", _ID, nullable=False),
        sa.Column("workspace_id", _ID, nullable=False),
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("worker_id", _ID, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cause", sa.String(32), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
    )
    op.create_index("ix_worker_failures_machine_id_at", "worker_failures", ["machine_id", "at"])
    op.create_table(
        "gpu_faults",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("machine_id", _ID, nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(1000), nullable=False),
    )
    op.create_index("ix_gpu_faults_machine_id_at", "gpu_faults", ["machine_id", "at"])


def downgrade() -> None:
    op.drop_table("gpu_faults")
    op.drop_table("worker_failures")
