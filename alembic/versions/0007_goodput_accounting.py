"""goodput accounting

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import backend.db

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('accounting_marks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('counted_until', backend.db.UTCDateTime(timezone=True), nullable=True),
    sa.Column('ticked_at', backend.db.UTCDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_accounting_marks'))
    )
    op.create_table('goodput_hours',
    sa.Column('hour', backend.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('workspace_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cluster_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('scope_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('category', sa.String(length=16), nullable=False),
    sa.Column('held', sa.Boolean(), nullable=False),
    sa.Column('gpu_seconds', sa.Float(), nullable=False),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_goodput_hours')),
    sa.UniqueConstraint('hour', 'workspace_id', 'cluster_id', 'scope', 'scope_id', 'category', 'held', name='uq_goodput_hours_cell')
    )
    with op.batch_alter_table('goodput_hours', schema=None) as batch_op:
        batch_op.create_index('ix_goodput_hours_scope_hour', ['scope', 'hour'], unique=False)

    op.create_table('goodput_intervals',
    sa.Column('worker_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('worker_name', sa.String(length=80), nullable=False),
    sa.Column('run_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('workspace_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cluster_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('machine_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('pool_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('start_at', backend.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('end_at', backend.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('category', sa.String(length=16), nullable=False),
    sa.Column('held', sa.Boolean(), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_goodput_intervals'))
    )
    with op.batch_alter_table('goodput_intervals', schema=None) as batch_op:
        batch_op.create_index('ix_goodput_intervals_end_at', ['end_at'], unique=False)
        batch_op.create_index('ix_goodput_intervals_machine_id_start_at', ['machine_id', 'start_at'], unique=False)
        batch_op.create_index('ix_goodput_intervals_run_id_start_at', ['run_id', 'start_at'], unique=False)
        batch_op.create_index('ix_goodput_intervals_workspace_id_start_at', ['workspace_id', 'start_at'], unique=False)

    with op.batch_alter_table('state_transitions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('accounted', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.create_index('ix_state_transitions_unaccounted', ['transition_at'], unique=False, postgresql_where=sa.text('NOT accounted'), sqlite_where=sa.text('NOT accounted'))



def downgrade() -> None:
    with op.batch_alter_table('state_transitions', schema=None) as batch_op:
        batch_op.drop_index('ix_state_transitions_unaccounted', postgresql_where=sa.text('NOT accounted'), sqlite_where=sa.text('NOT accounted'))
        batch_op.drop_column('accounted')

    with op.batch_alter_table('goodput_intervals', schema=None) as batch_op:
        batch_op.drop_index('ix_goodput_intervals_workspace_id_start_at')
        batch_op.drop_index('ix_goodput_intervals_run_id_start_at')
        batch_op.drop_index('ix_goodput_intervals_machine_id_start_at')
        batch_op.drop_index('ix_goodput_intervals_end_at')

    op.drop_table('goodput_intervals')
    with op.batch_alter_table('goodput_hours', schema=None) as batch_op:
        batch_op.drop_index('ix_goodput_hours_scope_hour')

    op.drop_table('goodput_hours')
    op.drop_table('accounting_marks')
