"""The cost report (issue 23): the GPU time held on priced pools over a period as money, by
workspace or run, by held category.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import interval_queries, ledger_queries, rules
from backend.accounting.rules import Category, Period
from backend.accounting.viewers import Viewer
from backend.clock import iso_z
from backend.errors import FieldError, InvalidInput
from backend.organizations import service as organizations

COST_SCOPES = ("workspace", "run")


@dataclass(frozen=True)
class CostRow:
    """A workspace's or run's GPU time on priced pools as money, by held category."""

    name: str
    by_category: dict[Category, float]

    @property
    def held(self) -> float:
        return math.fsum(self.by_category.values())

    @property
    def lost(self) -> float:
        """All but productive: what the goodput report calls lost, as money."""
        return math.fsum(v for c, v in self.by_category.items() if c != Category.PRODUCTIVE)

    def to_json(self) -> dict[str, object]:
        return {
            "cost": {
                c.value: self.by_category[c] for c in rules.CATEGORIES if c in self.by_category
            },
            "held_cost": self.held,
            "lost_cost": self.lost,
        }


@dataclass(frozen=True)
class CostReport:
    by: str
    period: Period
    currency: str | None  # None: no pool has a price
    rows: list[CostRow]
    total: CostRow

    def to_json(self) -> dict[str, object]:
        return {
            "by": self.by,
            "start": iso_z(self.period.start),
            "end": iso_z(self.period.end),
            "currency": self.currency,
            "ledgers": [{"name": r.name, **r.to_json()} for r in self.rows],
            "total": self.total.to_json(),
        }


def _held_categories() -> dict[Category, float]:
    return {c: 0.0 for c in rules.CATEGORIES if c != Category.WAITING}


async def costs(
    session: AsyncSession, viewer: Viewer, organization_id: int, by: str | None, period: Period
) -> CostReport:
    """The GPU time held on priced pools over the period as money (each interval's GPU-hours
    times its pool's price per GPU-hour), by workspace or run, most first: nothing held has no
    cost (waiting), a pool without a price none either."""
    scope = by or "workspace"
    if scope not in COST_SCOPES:
        raise InvalidInput("INVALID_PARAMETER", [FieldError("by", "must be one of workspace, run")])
    prices = await organizations.pool_prices(session, organization_id)
    pieces = await interval_queries.priced_pieces(
        session,
        period.start,
        period.end,
        list(prices),
        workspace_ids=viewer.workspace_ids,
        cluster_id=viewer.cluster_id,
    )
    money: dict[int, dict[Category, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in pieces:
        seconds = (min(p.end_at, period.end) - max(p.start_at, period.start)).total_seconds()
        if seconds <= 0:
            continue
        key = p.run_id if scope == "run" else p.workspace_id
        money[key][rules.CATEGORY_BY_VALUE[p.category]].append(
            seconds * p.gpus / 3600 * prices[p.pool_id][0]
        )
    names = await ledger_queries.scope_names(session, scope, list(money))
    rows = []
    for key, parts in money.items():
        by_category = _held_categories()
        for category, amounts in parts.items():
            by_category[category] = math.fsum(amounts)
        rows.append(CostRow(names.get(key, f"(deleted {scope} {key})"), by_category))
    rows.sort(key=lambda r: (-r.held, r.name))
    total = _held_categories()
    for category in total:
        total[category] = math.fsum(r.by_category[category] for r in rows)
    currency = next(iter({c for _, c in prices.values()}), None)
    return CostReport(scope, period, currency, rows, CostRow("TOTAL", total))
