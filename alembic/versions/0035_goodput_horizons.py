"""goodput_horizons: how far the goodput tick counts a Slurm-backed cluster's jobs while its
import is behind (issue 38 F3)

Revision ID: 0035
Revises: 0034
"""

from collections.abc import Sequence

import sqlalchemy as sa

import backend.db
from alembic import op

revision: str = "0035"
down_revision: str | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "goodput_horizons",
        sa.Column("cluster_id", BIG_ID, nullable=False),
        sa.Column("counted_to", backend.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_goodput_horizons_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("cluster_id", name=op.f("pk_goodput_horizons")),
    )


def downgrade() -> None:
    op.drop_table("goodput_horizons")
