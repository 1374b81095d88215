"""goodput days

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import backend.db

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('goodput_days',
    sa.Column('day', backend.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('workspace_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('cluster_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('scope_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('category', sa.String(length=16), nullable=False),
    sa.Column('held', sa.Boolean(), nullable=False),
    sa.Column('gpu_seconds', sa.Float(), nullable=False),
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_goodput_days')),
    sa.UniqueConstraint('day', 'workspace_id', 'cluster_id', 'scope', 'scope_id', 'category', 'held', name='uq_goodput_days_cell')
    )
    with op.batch_alter_table('goodput_days', schema=None) as batch_op:
        batch_op.create_index('ix_goodput_days_scope_day', ['scope', 'day'], unique=False)
    _days_from_hours()


def _days_from_hours() -> None:
    """The days of the hours counted before this table existed."""
    hour_type = backend.db.UTCDateTime(timezone=True)
    hours = sa.table(
        'goodput_hours', sa.column('hour', hour_type), *(sa.column(c) for c in (
            'workspace_id', 'cluster_id', 'scope', 'scope_id', 'category', 'held',
            'gpu_seconds',
        )),
    )
    days: dict[tuple[object, ...], float] = {}
    bind = op.get_bind()
    for row in bind.execute(sa.select(hours)):
        hour = row.hour
        key = (hour.replace(hour=0, minute=0, second=0, microsecond=0), row.workspace_id,
               row.cluster_id, row.scope, row.scope_id, row.category, row.held)
        days[key] = days.get(key, 0.0) + row.gpu_seconds
    target = sa.table('goodput_days', sa.column('day', hour_type), *(sa.column(c) for c in (
        'workspace_id', 'cluster_id', 'scope', 'scope_id', 'category', 'held', 'gpu_seconds',
    )))
    rows = [
        dict(zip(('day', 'workspace_id', 'cluster_id', 'scope', 'scope_id', 'category', 'held'),
                 key, strict=True), gpu_seconds=seconds)
        for key, seconds in days.items()
    ]
    if rows:
        bind.execute(target.insert(), rows)


def downgrade() -> None:
    with op.batch_alter_table('goodput_days', schema=None) as batch_op:
        batch_op.drop_index('ix_goodput_days_scope_day')

    op.drop_table('goodput_days')
