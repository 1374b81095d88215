"""Resolvers of goodput: each decodes its input, calls one of accounting's read models, maps it."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from backend.accounting import costs, explain, reports, series, viewers
from backend.request.context import Info
from backend.schema.goodput import (
    CostScope,
    GoodputCost,
    GoodputInterval,
    GoodputReport,
    GoodputScope,
    GoodputSeries,
    GoodputStep,
    GoodputWeek,
)


def _time(moment: datetime | None) -> str | None:
    """As the REST shim's ``start``/``end``, bounded there (the offset kept: year 1 with
    iso_z read back as ``1-01-01…``, not a time)."""
    return moment.isoformat() if moment is not None else None


async def goodput(
    info: Info,
    by: GoodputScope = GoodputScope.WORKSPACE,
    start: datetime | None = None,
    end: datetime | None = None,
    workspace: str | None = None,
) -> GoodputReport:
    """A ledger per run, machine, pool or workspace over whole UTC hours (the last 7 days by
    default; at most 400)."""
    principal = info.context.require_principal()
    period = viewers.period_of(_time(start), _time(end), info.context.clock.now())
    async with info.context.db.read() as session:
        viewer = await viewers.viewer_for(session, principal, workspace)
        found = await reports.report(session, viewer, by.value, period)
    return GoodputReport.of(found)


async def goodput_cost(
    info: Info,
    by: CostScope = CostScope.WORKSPACE,
    start: datetime | None = None,
    end: datetime | None = None,
    workspace: str | None = None,
) -> GoodputCost:
    """The GPU time held on priced pools as money, by workspace or run (the last 7 days by
    default)."""
    principal = info.context.require_principal()
    period = viewers.period_of(_time(start), _time(end), info.context.clock.now())
    async with info.context.db.read() as session:
        viewer = await viewers.viewer_for(session, principal, workspace)
        found = await costs.costs(session, viewer, principal.organization_id, by.value, period)
    return GoodputCost.of(found)


async def goodput_weekly(
    info: Info,
    by: GoodputScope = GoodputScope.RUN,
    weeks: int = 8,
    workspace: str | None = None,
) -> list[GoodputWeek]:
    """The last ISO weeks (Monday, UTC), this one included, oldest first."""
    principal = info.context.require_principal()
    count = reports.weeks_of(weeks)
    async with info.context.db.read() as session:
        viewer = await viewers.viewer_for(session, principal, workspace)
        found = await reports.weekly(session, viewer, by.value, count, info.context.clock.now())
    return [GoodputWeek(week=w, report=GoodputReport.of(r)) for w, r in found]


async def goodput_series(
    info: Info,
    by: GoodputScope = GoodputScope.WORKSPACE,
    name: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    step: GoodputStep = GoodputStep.HOUR,
    workspace: str | None = None,
) -> GoodputSeries:
    """A ledger each hour or UTC day of whole UTC hours (the last 7 days by default, at most
    400): of one row by name, or of every row summed."""
    principal = info.context.require_principal()
    period = viewers.period_of(_time(start), _time(end), info.context.clock.now())
    async with info.context.db.read() as session:
        viewer = await viewers.viewer_for(session, principal, workspace)
        found = await series.series(
            session, viewer, principal, by=by.value, name=name, step=step.value, period=period
        )
    return GoodputSeries.of(found)


async def goodput_intervals(
    info: Info,
    by: GoodputScope,
    name: str,
    category: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    workspace: str | None = None,
    limit: int = 1000,
) -> list[GoodputInterval]:
    """The worker intervals behind a figure: of one run, machine, pool or workspace, maybe one
    category, earliest first."""
    principal = info.context.require_principal()
    period = viewers.period_of(_time(start), _time(end), info.context.clock.now())
    async with info.context.db.read() as session:
        viewer = await viewers.viewer_for(session, principal, workspace)
        found = await explain.explain(
            session,
            viewer,
            principal,
            by=by.value,
            name=name,
            category=category,
            period=period,
            limit=explain.interval_limit(limit),
        )
    return [_interval(i) for i in found]


def _interval(i: explain.Explained) -> GoodputInterval:
    return GoodputInterval(**dataclasses.asdict(i))
