"""the install's keys: the one the API's ids are shown with (issue 37 N8)

Revision ID: 0033
Revises: 0032
"""

import os
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    keys = op.create_table(
        "install_keys",
        sa.Column("name", sa.String(length=40), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_install_keys")),
    )
    op.bulk_insert(keys, [{"name": "ids", "value": os.urandom(16)}])


def downgrade() -> None:
    op.drop_table("install_keys")
