"""Goodput over time: a scope's ledger hour by hour or UTC day by day over a period, from the
same cells as the report, so that the points sum to the report's row (or total).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting import ledger_queries, rules, series_queries
from backend.accounting.rules import Ledger, Period
from backend.accounting.viewers import Viewer, scope_of
from backend.clock import iso_z
from backend.errors import FieldError, InvalidInput, NotFound


@dataclass(frozen=True)
class Point:
    """One step of a series: the ledger of [start, end)."""

    start: datetime
    end: datetime
    ledger: Ledger

    def to_json(self) -> dict[str, object]:
        return {"start": iso_z(self.start), "end": iso_z(self.end), **self.ledger.to_json()}


@dataclass(frozen=True)
class Series:
    """A scope's ledger step by step over a period: every hour or UTC day, none left out."""

    by: str
    name: str | None
    step: str
    period: Period
    points: list[Point]

    @functools.cached_property
    def total(self) -> Ledger:
        """The points summed: the report's ledger for the same period and scope."""
        return Ledger(
            {c: math.fsum(p.ledger.held[c] for p in self.points) for c in rules.CATEGORIES},
            {c: math.fsum(p.ledger.not_held[c] for p in self.points) for c in rules.CATEGORIES},
        )

    def to_json(self) -> dict[str, object]:
        return {
            "by": self.by,
            "name": self.name,
            "step": self.step,
            "start": iso_z(self.period.start),
            "end": iso_z(self.period.end),
            "points": [p.to_json() for p in self.points],
            "total": self.total.to_json(),
        }


def _step(step: str | None) -> str:
    chosen = step or "hour"
    if chosen not in rules.STEPS:
        raise InvalidInput("INVALID_PARAMETER", [FieldError("step", "must be one of hour, day")])
    return chosen


async def series(
    session: AsyncSession,
    viewer: Viewer,
    principal: Principal,
    *,
    by: str | None,
    name: str | None,
    step: str | None,
    period: Period,
) -> Series:
    """The ledger of one run, machine, pool or workspace (by name), or of every one the viewer
    reads (no name), each hour or UTC day of the period, from the same cells as the report:
    the points sum to the report's row (or total) for that period and scope."""
    scope, unit = scope_of(by), _step(step)
    scope_id = None
    workspace_ids = viewer.workspace_ids
    if name:
        scope_id = await ledger_queries.scope_id(
            session, scope, name, principal.organization_id, workspace_ids
        )
        if scope == "workspace" and workspace_ids is not None and scope_id not in workspace_ids:
            scope_id = None  # a workspace the caller does not read is not named
        if scope_id is None:
            raise NotFound("NOT_FOUND", f"No {scope} named '{name}'.")
    points = rules.series_points(period, unit)
    cells: dict[datetime, list[tuple[str, bool, float]]] = defaultdict(list)

    async def add(cell_unit: str, start: datetime, end: datetime) -> None:
        for moment, category, held, seconds in await series_queries.cell_sums(
            session,
            cell_unit,
            scope,
            start,
            end,
            workspace_ids=workspace_ids,
            cluster_id=viewer.cluster_id,
            scope_id=scope_id,
        ):
            point = moment if unit == "hour" else max(rules.day_floor(moment), period.start)
            cells[point].append((category, held, seconds))

    if unit == "hour":
        await add("hour", period.start, period.end)
    else:  # whole days from the daily cells; a day the period covers in part from its hours
        whole = [p for p in points if p.end - p.start == rules.DAY]
        if whole:
            await add("day", whole[0].start, whole[-1].end)
        for part in points:
            if part not in whole:
                await add("hour", part.start, part.end)
    return Series(
        scope,
        name or None,
        unit,
        period,
        [Point(p.start, p.end, Ledger.of_sums(cells.get(p.start, ()))) for p in points],
    )
