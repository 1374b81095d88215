"""What a machine's troubles cost (issue 23: lemon machines): each machine's held GPU time of
failures, restarts and stalls over a period, which machine health (backend/machines) reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import ledger_queries, rules
from backend.accounting.rules import Category, Period

# The GPU time a machine's troubles cost where it was spent: its workers' failures (their
# gangs torn down), restarts and stalls, held on it.
MACHINE_LOSSES = (Category.FAILURE, Category.RESTART, Category.STALLED)


async def machine_losses(
    session: AsyncSession, machine_ids: Sequence[int], period: Period
) -> dict[int, dict[Category, float]]:
    """Each machine's held GPU-seconds of MACHINE_LOSSES over the period's whole hours, every
    workspace's (the caller may see these machines: an organisation admin)."""
    if not machine_ids:
        return {}
    sums = await ledger_queries.hour_sums(
        session, "machine", period.start, period.end, scope_ids=list(machine_ids)
    )
    out: dict[int, dict[Category, float]] = {
        m: dict.fromkeys(MACHINE_LOSSES, 0.0) for m in machine_ids
    }
    for machine_id, category, held, seconds in sums:
        kind = rules.CATEGORY_BY_VALUE.get(category)
        if held and kind in MACHINE_LOSSES and machine_id in out:
            out[machine_id][kind] += seconds
    return out
