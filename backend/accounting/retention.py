"""How long the ledgers are kept: the hourly ledgers and their intervals 400 days (seed G-43),
then pruned by the ``accounting.prune`` job.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import ledger_writes, rules
from backend.clock import Clock

RETENTION = timedelta(days=400)


async def prune(session: AsyncSession, clock: Clock) -> tuple[int, int]:
    """The hourly ledgers and their intervals are kept 400 days (seed G-43), then deleted:
    from the whole hour 400 days ago, so a retried prune deletes nothing more."""
    return await ledger_writes.prune(session, rules.hour_floor(clock.now() - RETENTION))
