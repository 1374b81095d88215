"""workspaces have a priority ceiling and a preemption policy

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing workspaces get the default ceiling (50, a run's default priority); runs already
    # submitted above it keep their priority. No cluster lets workspaces preempt each other.
    with op.batch_alter_table("workspaces", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "priority_ceiling", sa.Integer(), server_default=sa.text("50"), nullable=False
            )
        )
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("preempt_over_quota", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.drop_column("preempt_over_quota")
    with op.batch_alter_table("workspaces", schema=None) as batch_op:
        batch_op.drop_column("priority_ceiling")
