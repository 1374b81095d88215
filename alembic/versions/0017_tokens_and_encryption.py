"""tokens expire; secret values are encrypted at rest

Revision ID: 0017
Revises: 0016

Secret values and webhook secrets already stored clear are encrypted here, with the keys the
server uses (backend/crypto.py: ASTRAEUS_SECRET_KEY, or the key file, made in the data
folder if absent). A deployment that upgrades from another machine than its servers must give
the upgrade the same ASTRAEUS_SECRET_KEY.
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

import backend.db
from backend import crypto

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = backend.db.UTCDateTime(timezone=True)

# (table, column) holding a secret
SECRET_COLUMNS = (("secrets", "value"), ("webhooks", "secret"))


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires_at", TIME, nullable=True))
    # A ciphertext is longer than the 64 characters a webhook secret had.
    _change_secret_type(sa.String(length=64), sa.Text())
    _rewrite(lambda keys, clear: keys.encrypt(clear))


def downgrade() -> None:
    _rewrite(lambda keys, stored: keys.decrypt(stored))
    _change_secret_type(sa.Text(), sa.String(length=64))
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("expires_at")


def _change_secret_type(before: sa.types.TypeEngine[str], after: sa.types.TypeEngine[str]) -> None:
    """webhooks.secret's type changed. SQLite changes a column's type by rebuilding the table,
    and dropping the old webhooks cascades to every delivery: they are kept aside meanwhile."""
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column("webhooks", "secret", existing_type=before, type_=after)
        return
    op.execute("CREATE TEMP TABLE kept_deliveries AS SELECT * FROM webhook_deliveries")
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.alter_column("secret", existing_type=before, type_=after, existing_nullable=False)
    op.execute("DELETE FROM webhook_deliveries")
    op.execute("INSERT INTO webhook_deliveries SELECT * FROM kept_deliveries")
    op.execute("DROP TABLE kept_deliveries")


def _rewrite(change: Callable[[crypto.Keyring, str], str]) -> None:
    """Every stored secret, changed by ``change``; the keys are loaded only if there is one."""
    bind = op.get_bind()
    for table, column in SECRET_COLUMNS:
        rows = bind.execute(
            sa.text(f"SELECT id, {column} FROM {table} WHERE {column} IS NOT NULL")
        ).all()
        for row_id, stored in rows:
            bind.execute(
                sa.text(f"UPDATE {table} SET {column} = :v WHERE id = :id"),
                {"v": change(crypto.keyring(), stored), "id": row_id},
            )
