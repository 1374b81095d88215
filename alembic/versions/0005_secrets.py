"""secrets

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import backend.db

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('secrets',
    sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
    sa.Column('workspace_id', BIG_ID, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('value', sa.Text(), nullable=True),
    sa.Column('external', sa.Boolean(), nullable=False),
    sa.Column('updated_at', backend.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('created_at', backend.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], name=op.f('fk_secrets_workspace_id_workspaces'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_secrets')),
    sa.UniqueConstraint('workspace_id', 'name', name=op.f('uq_secrets_workspace_id_name'))
    )
    op.create_index(op.f('ix_secrets_workspace_id'), 'secrets', ['workspace_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_secrets_workspace_id'), table_name='secrets')
    op.drop_table('secrets')
