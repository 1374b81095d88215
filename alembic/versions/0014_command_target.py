"""agent commands name their worker by id, kept after the worker's row is deleted

Revision ID: 0014
Revises: 0013
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agent_commands") as batch:
        batch.add_column(sa.Column("target_worker_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True))
    op.execute("UPDATE agent_commands SET target_worker_id = worker_id")


def downgrade() -> None:
    with op.batch_alter_table("agent_commands") as batch:
        batch.drop_column("target_worker_id")
