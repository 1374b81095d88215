"""Slurm-backed clusters (issue 25): how a cluster's Slurm is reached, which workspace each Slurm
account's jobs are imported into, where each cluster's import stands, and a run's id in the
scheduler that runs it (a Slurm job id)

Revision ID: 0030
Revises: 0029
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("slurm", _JSON, nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("external_id", sa.String(64), nullable=True))
    op.create_index(
        "uq_runs_cluster_id_external_id",
        "runs",
        ["cluster_id", "external_id"],
        unique=True,
        sqlite_where=sa.text("external_id IS NOT NULL"),
        postgresql_where=sa.text("external_id IS NOT NULL"),
    )
    op.create_table(
        "slurm_accounts",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column(
            "cluster_id", _ID, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("account", sa.String(64), nullable=False),
        sa.Column(
            "workspace_id",
            _ID,
            sa.ForeignKey("workspaces.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("cluster_id", "account"),
    )
    op.create_index("ix_slurm_accounts_cluster_id", "slurm_accounts", ["cluster_id"])
    op.create_index("ix_slurm_accounts_workspace_id", "slurm_accounts", ["workspace_id"])
    op.create_table(
        "slurm_imports",
        sa.Column(
            "cluster_id",
            _ID,
            sa.ForeignKey("clusters.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("imported_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.String(1000), nullable=True),
        sa.Column("error_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("unmapped", _JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("slurm_imports")
    op.drop_table("slurm_accounts")
    op.drop_index("uq_runs_cluster_id_external_id", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("external_id")
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("slurm")
