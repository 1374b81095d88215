"""What the runs' running totals must be: for every run, one row an hour from its first cell
to its last, each the sum of its cells up to that hour, the latest marked last."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import rules
from backend.models import GoodputHour, GoodputRunTotal
from backend.models.goodput import TOTAL_COLUMNS


async def assert_run_totals_match_the_hours(session: AsyncSession) -> None:
    cells: dict[int, dict[datetime, list[float]]] = defaultdict(dict)
    for c in await session.scalars(select(GoodputHour).where(GoodputHour.scope == "run")):
        sums = cells[c.scope_id].setdefault(c.hour, [0.0] * len(TOTAL_COLUMNS))
        sums[TOTAL_COLUMNS.index(f"{c.category}_{'held' if c.held else 'not_held'}")] += (
            c.gpu_seconds
        )
    table = GoodputRunTotal.__table__
    rows: dict[int, dict[datetime, tuple[bool, list[float]]]] = defaultdict(dict)
    for r in await session.execute(select(table)):
        rows[r.run_id][r.hour] = (r.last, [getattr(r, c) for c in TOTAL_COLUMNS])
    assert set(rows) == set(cells), "a run with cells has running totals, and only such a run"
    for run_id, by_hour in cells.items():
        first, final = min(by_hour), max(by_hour)
        hours = [first + i * rules.HOUR for i in range(int((final - first) / rules.HOUR) + 1)]
        assert sorted(rows[run_id]) == hours, f"run {run_id}: an hour skipped or one too many"
        total = [0.0] * len(TOTAL_COLUMNS)
        for hour in hours:
            added = by_hour.get(hour)  # none: the hour repeats the one before
            if added is not None:
                total = [t + s for t, s in zip(total, added, strict=True)]
            last, got = rows[run_id][hour]
            assert last == (hour == final), (run_id, hour)
            for column, want, have in zip(TOTAL_COLUMNS, total, got, strict=True):
                assert abs(want - have) <= 1e-6 * max(1.0, abs(want)), (run_id, hour, column)
