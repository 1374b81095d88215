"""A cluster's ledgers by workspace or pool over whole hours, and the names of what ledgers
count: what the threshold alerts (backend/alerts) compare with their thresholds.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import ledger_queries
from backend.accounting.rules import Ledger, ledgers_by_id


async def cluster_ledgers(
    session: AsyncSession, scope: str, cluster_id: int, start: datetime, end: datetime
) -> dict[int, Ledger]:
    """Each workspace's or pool's ledger of one cluster over the hours of [start, end)."""
    return ledgers_by_id(
        await ledger_queries.hour_sums(session, scope, start, end, cluster_id=cluster_id)
    )


async def scope_names(session: AsyncSession, scope: str, ids: Sequence[int]) -> dict[int, str]:
    """The names of runs, machines, pools or workspaces, by id."""
    return await ledger_queries.scope_names(session, scope, ids)
