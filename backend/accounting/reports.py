"""The goodput report: a ledger per run, machine, pool or workspace over a period, and their
total, each with the rework in its productive time; the same report week by week (ISO weeks).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import ledger_queries, rules
from backend.accounting.rework import ScopeRework, scope_rework
from backend.accounting.rules import Ledger, Period, iso_week, week_start
from backend.accounting.viewers import Viewer, scope_of
from backend.clock import iso_z
from backend.errors import FieldError, InvalidInput
from backend.parsing import whole_number

WEEK = timedelta(weeks=1)


@dataclass(frozen=True)
class Row:
    """One ledger of a report: a run, machine, pool or workspace by its name, its GPU-seconds
    by category held and not (in the order of CATEGORIES), and the rework in its productive
    time (issue 23)."""

    name: str
    held: Sequence[float]
    not_held: Sequence[float]
    rework: ScopeRework = dataclasses.field(default_factory=lambda: ScopeRework(0.0, 0))

    @functools.cached_property
    def ledger(self) -> Ledger:
        """Made when read: a page of a report over 10 000 runs reads a hundred."""
        return Ledger.of_columns(self.held, self.not_held)


@dataclass(frozen=True)
class Report:
    by: str
    period: Period
    rows: list[Row]
    total: Ledger
    rework: ScopeRework = dataclasses.field(default_factory=lambda: ScopeRework(0.0, 0))

    def to_json(self) -> dict[str, object]:
        return {
            "by": self.by,
            "start": iso_z(self.period.start),
            "end": iso_z(self.period.end),
            "ledgers": [
                {"name": r.name, **r.ledger.to_json(), **r.rework.to_json(self.by == "run")}
                for r in self.rows
            ],
            "total": {**self.total.to_json(), **self.rework.to_json(False)},
        }


async def report(session: AsyncSession, viewer: Viewer, by: str | None, period: Period) -> Report:
    """A ledger per run, machine, pool or workspace over the period, and their total."""
    scope = scope_of(by)
    ledgers = await ledger_queries.named_ledgers(
        session,
        scope,
        period.start,
        period.end,
        workspace_ids=viewer.workspace_ids,
        cluster_id=viewer.cluster_id,
    )
    rework, total_rework = await scope_rework(session, viewer, scope, period)
    rows = [
        Row(r.name, r.held, r.not_held, rework.get(r.scope_id, ScopeRework(0.0, 0)))
        for r in ledgers
    ]
    total = Ledger.of_columns(
        [math.fsum(column) for column in zip(*(r.held for r in ledgers), strict=True)],
        [math.fsum(column) for column in zip(*(r.not_held for r in ledgers), strict=True)],
    )
    return Report(scope, period, rows, total, total_rework)


async def weekly(
    session: AsyncSession, viewer: Viewer, by: str | None, weeks: int, now: datetime
) -> list[tuple[str, Report]]:
    """The last ``weeks`` ISO weeks (Monday, UTC), this one included, newest last."""
    first = week_start(now) - timedelta(weeks=weeks - 1)
    out = []
    for i in range(weeks):
        start = first + timedelta(weeks=i)
        out.append(
            (iso_week(start), await report(session, viewer, by, Period(start, start + WEEK)))
        )
    return out


def weeks_of(raw: str | int | None) -> int:
    """How many weeks a weekly report covers: 8 by default, at most a period's 400 days."""
    if raw is None or raw == "":
        return 8
    weeks = whole_number(raw, 1, rules.MAX_WEEKS)
    if weeks is None:
        raise InvalidInput(
            "INVALID_PARAMETER",
            [FieldError("weeks", f"must be a whole number from 1 to {rules.MAX_WEEKS}")],
        )
    return weeks
