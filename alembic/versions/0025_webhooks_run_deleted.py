"""webhooks that asked for run.state keep getting runs' deletions, now their own kind run.deleted
(issue 21: a deletion was a run.state event of state Deleted; since, 'run.state' names only
run.state): run.deleted is added to their kinds, unless 'run' already names it

Revision ID: 0025
Revises: 0024
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_WEBHOOKS = sa.table("webhooks", sa.column("id", sa.Integer), sa.column("kinds", _JSON))


def _rewrite(change: Callable[[list[str]], list[str] | None]) -> None:
    """Each webhook's kinds through ``change`` (None: left as they are)."""
    connection = op.get_bind()
    for id_, kinds in connection.execute(sa.select(_WEBHOOKS.c.id, _WEBHOOKS.c.kinds)).all():
        changed = change(list(kinds or []))
        if changed is not None:
            connection.execute(
                _WEBHOOKS.update().where(_WEBHOOKS.c.id == id_).values(kinds=changed)
            )


def upgrade() -> None:
    # 'run' names both already; no kinds at all is every kind
    _rewrite(
        lambda kinds: (
            kinds + ["run.deleted"]
            if "run.state" in kinds and "run.deleted" not in kinds and "run" not in kinds
            else None
        )
    )


def downgrade() -> None:
    # down, run.state holds deletions again
    _rewrite(
        lambda kinds: (
            [k for k in kinds if k != "run.deleted"]
            if "run.state" in kinds and "run.deleted" in kinds
            else None
        )
    )
