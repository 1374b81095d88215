"""code_archives and code_chunks: a run's code shipped with it (--workdir, issue 41), stored
once per workspace by its SHA-256; runs.code_id names the one a run ships with

Revision ID: 0039
Revises: 0038
"""

from collections.abc import Sequence

import sqlalchemy as sa

import backend.db
from alembic import op

revision: str = "0039"
down_revision: str | None = "0038"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "code_archives",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("workspace_id", BIG_ID, nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("archive_bytes", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("uploaded_at", backend.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("used_at", backend.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_code_archives_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_code_archives")),
    )
    op.create_index(
        "uq_code_archives_workspace_id_digest",
        "code_archives",
        ["workspace_id", "digest"],
        unique=True,
    )
    op.create_table(
        "code_chunks",
        sa.Column("archive_id", BIG_ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["archive_id"],
            ["code_archives.id"],
            name=op.f("fk_code_chunks_archive_id_code_archives"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("archive_id", "seq", name=op.f("pk_code_chunks")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("code_id", BIG_ID, nullable=True))
        batch_op.create_index(batch_op.f("ix_runs_code_id"), ["code_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_code_id"))
        batch_op.drop_column("code_id")
    op.drop_table("code_chunks")
    op.drop_index("uq_code_archives_workspace_id_digest", table_name="code_archives")
    op.drop_table("code_archives")
