"""The SQL of goodput over time: a scope's ledger cells summed by hour or by UTC day (the
report's are in ledger_queries.py, from the same cells)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import GoodputDay, GoodputHour


async def cell_sums(
    session: AsyncSession,
    unit: str,
    scope: str,
    start: datetime,
    end: datetime,
    *,
    workspace_ids: Sequence[int] | None,
    cluster_id: int | None,
    scope_id: int | None,
) -> list[tuple[datetime, str, bool, float]]:
    """(hour or day, category, held, GPU-seconds) of the scope's cells in [start, end): of
    one run, machine, pool or workspace (``scope_id``), else of every one the viewer reads,
    summed. ``unit`` "day" reads the daily cells: whole UTC days only."""
    model: Any = GoodputDay if unit == "day" else GoodputHour
    moment = model.day if unit == "day" else model.hour
    keys = [moment, model.category, model.held]
    query = (
        select(*keys, func.sum(model.gpu_seconds))
        .where(model.scope == scope, moment >= start, moment < end)
        .group_by(*keys)
        .order_by(moment)
    )
    if workspace_ids is not None:
        query = query.where(model.workspace_id.in_(workspace_ids))
    if cluster_id is not None:
        query = query.where(model.cluster_id == cluster_id)
    if scope_id is not None:
        query = query.where(model.scope_id == scope_id)
    connection = await session.connection()  # Core rows: a year by hour is 8 760 points
    rows = await connection.execute(query)
    return [(r[0], r[1], bool(r[2]), float(r[3])) for r in rows]
