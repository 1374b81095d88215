"""a Slurm import's quarantined records: what Slurm printed that the import could not read,
set aside while the rest is imported (issue 38 F2)

Revision ID: 0034
Revises: 0033
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("slurm_imports") as batch:
        batch.add_column(sa.Column("quarantined", _JSON, nullable=False, server_default="{}"))


def downgrade() -> None:
    with op.batch_alter_table("slurm_imports") as batch:
        batch.drop_column("quarantined")
