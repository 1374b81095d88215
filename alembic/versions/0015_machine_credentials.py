"""machines hold credentials of their own, made from expiring join tokens

Revision ID: 0015
Revises: 0014

The cluster machine tokens made before (``api_tokens`` of kind ``agent``) move to
``join_tokens`` as legacy tokens, under the same digest: they keep working (as join tokens, and
directly for machines without a credential of their own) until an admin revokes them.
"""

from collections.abc import Sequence

import sqlalchemy as sa

import backend.db
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
WHEN = backend.db.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "join_tokens",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("organization_id", BIG_ID, nullable=False),
        sa.Column("cluster_id", BIG_ID, nullable=False),
        sa.Column("expires_at", WHEN, nullable=True),
        sa.Column("uses_left", sa.Integer(), nullable=True),
        sa.Column("legacy", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("last_used_at", WHEN, nullable=True),
        sa.Column("revoked_at", WHEN, nullable=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_join_tokens_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_join_tokens_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_join_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_join_tokens_token_hash")),
    )
    op.create_index(op.f("ix_join_tokens_cluster_id"), "join_tokens", ["cluster_id"])
    op.create_index(op.f("ix_join_tokens_organization_id"), "join_tokens", ["organization_id"])
    op.create_table(
        "machine_credentials",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("organization_id", BIG_ID, nullable=False),
        sa.Column("cluster_id", BIG_ID, nullable=False),
        sa.Column("machine", sa.String(length=253), nullable=False),
        sa.Column("join_token_id", BIG_ID, nullable=True),
        sa.Column("last_used_at", WHEN, nullable=True),
        sa.Column("revoked_at", WHEN, nullable=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_machine_credentials_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["join_token_id"],
            ["join_tokens.id"],
            name=op.f("fk_machine_credentials_join_token_id_join_tokens"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_machine_credentials_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_machine_credentials")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_machine_credentials_token_hash")),
    )
    op.create_index(
        "ix_machine_credentials_cluster_id_machine",
        "machine_credentials",
        ["cluster_id", "machine"],
    )
    op.create_index(
        op.f("ix_machine_credentials_join_token_id"), "machine_credentials", ["join_token_id"]
    )
    op.create_index(
        op.f("ix_machine_credentials_organization_id"), "machine_credentials", ["organization_id"]
    )
    op.execute(
        "INSERT INTO join_tokens (token_hash, prefix, name, organization_id, cluster_id, "
        "expires_at, uses_left, legacy, last_used_at, revoked_at, created_at) "
        "SELECT token_hash, prefix, name, organization_id, cluster_id, NULL, NULL, TRUE, "
        "last_used_at, revoked_at, created_at FROM api_tokens "
        "WHERE kind = 'agent' AND cluster_id IS NOT NULL"
    )
    op.execute("DELETE FROM api_tokens WHERE kind = 'agent'")


def downgrade() -> None:
    # Legacy tokens go back to being cluster machine tokens; join tokens and credentials go.
    op.execute(
        "INSERT INTO api_tokens (token_hash, prefix, name, kind, user_id, organization_id, "
        "workspace_id, cluster_id, last_used_at, revoked_at, created_at) "
        "SELECT token_hash, prefix, name, 'agent', NULL, organization_id, NULL, cluster_id, "
        "last_used_at, revoked_at, created_at FROM join_tokens WHERE legacy"
    )
    op.drop_index(op.f("ix_machine_credentials_organization_id"), table_name="machine_credentials")
    op.drop_index(op.f("ix_machine_credentials_join_token_id"), table_name="machine_credentials")
    op.drop_index("ix_machine_credentials_cluster_id_machine", table_name="machine_credentials")
    op.drop_table("machine_credentials")
    op.drop_index(op.f("ix_join_tokens_organization_id"), table_name="join_tokens")
    op.drop_index(op.f("ix_join_tokens_cluster_id"), table_name="join_tokens")
    op.drop_table("join_tokens")
