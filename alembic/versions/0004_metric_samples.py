"""metric samples

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def _sample_table(name: str) -> None:
    # The primary key is the covering index (INCLUDE on PostgreSQL, WITHOUT ROWID on SQLite);
    # see backend/models/metric.py for why.
    op.create_table(name,
    sa.Column('worker_id', BIG_ID, nullable=False),
    sa.Column('ts', sa.BigInteger(), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.Column('machine_id', BIG_ID, nullable=False),
    sa.Column('metric', sa.SmallInteger(), nullable=False),
    sa.Column('gpu', sa.SmallInteger(), nullable=False),
    sa.ForeignKeyConstraint(['worker_id'], ['workers.id'], name=op.f(f'fk_{name}_worker_id_workers'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('worker_id', 'metric', 'gpu', 'ts', name=op.f(f'pk_{name}'), postgresql_include=['value']),
    sqlite_with_rowid=False,
    )
    with op.batch_alter_table(name, schema=None) as batch_op:
        batch_op.create_index(f'ix_{name}_ts', ['ts'], unique=False, postgresql_using='brin')


def upgrade() -> None:
    _sample_table('metric_samples')
    _sample_table('metric_minutes')


def downgrade() -> None:
    op.drop_table('metric_minutes')
    op.drop_table('metric_samples')
