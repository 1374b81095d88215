"""SQL of the secrets domain's keys: every stored secret, written again."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import Secret, Webhook


async def rewrite_stored_secrets(session: AsyncSession) -> int:
    """Read every secret value and webhook secret (any configured key opens it) and write it
    back (the first key encrypts it): how many were written."""
    written = 0
    for column in (Secret.value, Webhook.secret):
        table = column.class_
        rows = (await session.execute(select(table.id, column).where(column.is_not(None)))).all()
        for row_id, clear in rows:
            await session.execute(
                update(table).where(table.id == row_id).values({column.key: clear})
            )
            written += 1
    return written
