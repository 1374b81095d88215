"""Goodput accounting's entry point: the ledgers read (reports, weeks, a run's own, the
Prometheus exposition, the intervals behind a figure) and pruned. The tick that counts
workers' time into them is backend/accounting/counting.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting import ledger_queries, ledger_writes, rules, series_queries
from backend.accounting.exposition import Exposition
from backend.accounting.rules import (
    SCOPES,
    Category,
    Ledger,
    Period,
    iso_week,
    parse_period,
    week_start,
)
from backend.clock import Clock, iso_z
from backend.errors import FieldError, Forbidden, InvalidInput, NotFound
from backend.lifecycle.progress import STRAGGLER_AFTER
from backend.models import Redo, Run
from backend.organizations import service as organizations
from backend.parsing import whole_number
from backend.runs import service as runs

WEEK = timedelta(weeks=1)


# -- reading the ledgers -------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Viewer:
    """Whose share of the ledgers a caller reads: some workspaces, maybe on one cluster."""

    workspace_ids: list[int] | None  # None: every workspace (of the cluster)
    cluster_id: int | None = None


def _by(by: str | None) -> str:
    scope = by or "workspace"
    if scope not in SCOPES:
        raise InvalidInput(
            "INVALID_PARAMETER", [FieldError("by", "must be one of workspace, run, machine, pool")]
        )
    return scope


def period_of(start: str | None, end: str | None, now: datetime) -> Period:
    period, problems = parse_period(start, end, now)
    if period is None:
        raise InvalidInput("INVALID_PARAMETER", [FieldError(f, r) for f, r in problems])
    return period


async def viewer_for(
    session: AsyncSession, principal: Principal, workspace: str | None = None
) -> Viewer:
    """A workspace's token reads its workspace's share (its runs' time on the machines they
    used); an organisation admin names any workspace of the organisation."""
    ws = await runs.workspace_for(session, principal, workspace)
    return Viewer([ws.id])


async def cluster_viewer(
    session: AsyncSession, principal: Principal, organization: str, cluster: str
) -> Viewer:
    """Every workspace's time on one cluster of the organisation: its admins only."""
    org = await organizations.organization_by_name(session, organization)
    if org.id != principal.organization_id:  # another organisation's clusters are not named
        raise NotFound("CLUSTER_NOT_FOUND", f"No cluster named '{cluster}'.")
    found = await organizations.cluster_by_name(session, org.id, cluster)
    if not principal.can_see_organization(org.id):
        raise Forbidden(
            f"A cluster's goodput needs an organisation admin of '{org.name}'; "
            "a member reads their workspace's at /v1/goodput."
        )
    return Viewer(None, found.id)


async def report(session: AsyncSession, viewer: Viewer, by: str | None, period: Period) -> Report:
    """A ledger per run, machine, pool or workspace over the period, and their total."""
    scope = _by(by)
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


async def run_ledger(
    session: AsyncSession,
    principal: Principal,
    name: str,
    now: datetime,
    workspace: str | None = None,
) -> tuple[Run, Ledger]:
    """A run's own ledger since it was submitted."""
    run = await runs.get_run(session, principal, name, workspace=workspace)
    return run, (await run_ledgers(session, [(run.id, run.created_at)], now))[run.id]


async def run_ledgers(
    session: AsyncSession, found: Sequence[tuple[int, datetime]], now: datetime
) -> dict[int, Ledger]:
    """Runs' ledgers since they were submitted (runs by id and submission time, which the
    caller may see), in one query."""
    if not found:
        return {}
    since = rules.hour_floor(min(created for _, created in found))
    until = rules.hour_floor(now) + rules.HOUR
    sums = await ledger_queries.hour_sums(
        session, "run", since, until, scope_ids=[run_id for run_id, _ in found]
    )
    ledgers = ledgers_by_id(sums)
    return {run_id: ledgers.get(run_id) or Ledger.empty() for run_id, _ in found}


@dataclass(frozen=True)
class RunClock:
    """What a run's ETTR is computed from besides its ledger: its id, when it was submitted,
    when it ended (None: it goes on) and its gang's GPUs."""

    run_id: int
    submitted: datetime
    ended: datetime | None
    gpus: int


def run_clock(run: Run) -> RunClock:
    """What ``run_ettrs`` reads of a run besides its ledger."""
    return RunClock(run.id, run.created_at, run.ended_at, run.worker_count * run.gpus_per_worker)


async def run_ettrs(
    session: AsyncSession, found: Sequence[RunClock], now: datetime
) -> dict[int, float | None]:
    """Runs' ETTR (rules.ettr) from their ledgers, their wall time to their end or to how
    far the tick has counted, whichever is first (the ledger holds nothing later)."""
    ledgers = await run_ledgers(session, [(r.run_id, r.submitted) for r in found], now)
    mark = await ledger_queries.counted_until(session)
    out: dict[int, float | None] = {}
    for r in found:
        until = mark if r.ended is None or mark is None else min(r.ended, mark)
        out[r.run_id] = (
            None
            if until is None
            else rules.ettr(ledgers[r.run_id].productive, r.gpus, r.submitted, until)
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


# -- machines' losses (issue 23: lemon machines) -------------------------------------------------

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


# -- cost (issue 23) ------------------------------------------------------------------------------

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
    pieces = await ledger_queries.priced_pieces(
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


# -- rework (issue 23) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScopeRework:
    """The rework in a row's (or a report's) productive time: the GPU-seconds of the runs
    whose rework is known, and how many runs restarted there without the checkpoint and step
    reports that make theirs known."""

    gpu_seconds: float
    unknown_runs: int

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    def shown_gpu_hours(self, one_run: bool) -> float | None:
        """A run's own figure is null when unknown ("unknown", not 0); a wider row's is what is
        known (its unknown runs counted beside it)."""
        return None if one_run and self.unknown_runs > 0 else self.gpu_hours

    def to_json(self, one_run: bool) -> dict[str, object]:
        return {
            "rework_gpu_hours": self.shown_gpu_hours(one_run),
            "rework_unknown_runs": self.unknown_runs,
        }


def _redo_span(piece: ledger_queries.RedoPiece | Redo) -> rules.RedoSpan:
    return rules.RedoSpan(
        piece.restarted_at, piece.until, piece.reached_step, piece.checkpoint_step
    )


async def scope_rework(
    session: AsyncSession, viewer: Viewer, scope: str, period: Period
) -> tuple[dict[int, ScopeRework], ScopeRework]:
    """Each run's, machine's, pool's or workspace's rework over the period (by id), and the
    viewer's total: the productive time inside its runs' redos."""
    pieces = await ledger_queries.redo_pieces(
        session,
        scope,
        period.start,
        period.end,
        workspace_ids=viewer.workspace_ids,
        cluster_id=viewer.cluster_id,
    )
    seconds: dict[int, list[float]] = defaultdict(list)
    unknown: dict[int, set[int]] = defaultdict(set)
    all_seconds: list[float] = []
    all_unknown: set[int] = set()
    for p in pieces:
        span = _redo_span(p)
        redone = rules.redone_seconds(p.start_at, p.end_at, p.gpus, span, period)
        if redone <= 0 or p.scope_id is None:
            continue
        if span.known:
            seconds[p.scope_id].append(redone)
            all_seconds.append(redone)
        else:
            unknown[p.scope_id].add(p.run_id)
            all_unknown.add(p.run_id)
    rows = {
        key: ScopeRework(math.fsum(seconds.get(key, [])), len(unknown.get(key, ())))
        for key in set(seconds) | set(unknown)
    }
    return rows, ScopeRework(math.fsum(all_seconds), len(all_unknown))


@dataclass(frozen=True)
class RedoFigure:
    """One restart of a run: where it went back to, what it had reached, and the GPU time it
    spent doing that again (None: unknown, the run reported no checkpoint or no step)."""

    attempt: int
    restarted_at: datetime
    checkpoint_step: int | None
    reached_step: int | None
    steps_redone: int | None
    until: datetime | None
    caught_up: bool
    gpu_seconds: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "restarted_at": iso_z(self.restarted_at),
            "checkpoint_step": self.checkpoint_step,
            "reached_step": self.reached_step,
            "steps_redone": self.steps_redone,
            "until": iso_z(self.until) if self.until is not None else None,
            "caught_up": self.caught_up,
            "gpu_hours": None if self.gpu_seconds is None else self.gpu_seconds / 3600,
        }


@dataclass(frozen=True)
class RunRework:
    """A run's rework since it was submitted: its restarts' redone GPU time (None: unknown,
    a restart without the reports that measure it), and each restart."""

    gpu_seconds: float | None
    redos: list[RedoFigure]

    @property
    def gpu_hours(self) -> float | None:
        return None if self.gpu_seconds is None else self.gpu_seconds / 3600

    def to_json(self) -> dict[str, object]:
        return {"gpu_hours": self.gpu_hours, "redos": [r.to_json() for r in self.redos]}


async def run_rework(session: AsyncSession, run: Run, now: datetime) -> RunRework:
    """The rework of a run the caller may see, since it was submitted."""
    found = await run_reworks(session, [(run.id, run.created_at, run.workspace_id)], now)
    return found[run.id]


async def run_reworks(
    session: AsyncSession, found: Sequence[tuple[int, datetime, int]], now: datetime
) -> dict[int, RunRework]:
    """Runs' rework since they were submitted (runs by id, submission time and workspace,
    which the caller may see): two queries for them all, none for runs that never restarted."""
    redos = await ledger_queries.redos_of(session, [run_id for run_id, _, _ in found])
    by_run: dict[int, list[Redo]] = defaultdict(list)
    for r in redos:
        by_run[r.run_id].append(r)
    restarted = [f for f in found if f[0] in by_run]
    by_redo: dict[int, list[float]] = defaultdict(list)
    if restarted:
        since = {run_id: created for run_id, created, _ in restarted}
        pieces = await ledger_queries.redo_pieces(
            session,
            "run",
            min(since.values()),
            max(now, *since.values()),
            workspace_ids=sorted({ws for _, _, ws in restarted}),
            run_ids=sorted(since),
        )
        for p in pieces:
            period = Period(since[p.run_id], max(now, since[p.run_id]))
            by_redo[p.redo_id].append(
                rules.redone_seconds(p.start_at, p.end_at, p.gpus, _redo_span(p), period)
            )
    out: dict[int, RunRework] = {}
    for run_id, _, _ in found:
        figures = []
        for r in by_run.get(run_id, []):
            span = _redo_span(r)
            figures.append(
                RedoFigure(
                    r.attempt,
                    r.restarted_at,
                    r.checkpoint_step,
                    r.reached_step,
                    span.steps_redone,
                    r.until,
                    r.caught_up,
                    math.fsum(by_redo.get(r.id, [])) if span.known else None,
                )
            )
        seconds = [f.gpu_seconds for f in figures]
        total = None if None in seconds else math.fsum(x for x in seconds if x is not None)
        out[run_id] = RunRework(total, figures)
    return out


# -- goodput over time --------------------------------------------------------------------------


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
    scope, unit = _by(by), _step(step)
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


# -- Prometheus ------------------------------------------------------------------------------------


def ledgers_by_id(sums: Iterable[tuple[int, str, bool, float]]) -> dict[int, Ledger]:
    parts: dict[int, list[tuple[str, bool, float]]] = defaultdict(list)
    for scope_id, category, held, seconds in sums:
        parts[scope_id].append((category, held, seconds))
    return {i: Ledger.of_sums(p) for i, p in parts.items()}


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


async def exposition(
    session: AsyncSession,
    principal: Principal,
    now: datetime,
    alerts_firing: dict[str, int] | None = None,
) -> str:
    """``GET /goodput/metrics``: what the caller may see, as Prometheus text.

    A workspace's token: its workspace, its share of the machines, pools and clusters it
    used, its runs still going. An organisation admin's: every workspace of the organisation."""
    names = await ledger_queries.workspaces(
        session,
        principal.organization_id,
        None if principal.is_org_admin else [principal.workspace_id or 0],
    )
    ids = list(names)
    out = Exposition()
    hour = rules.hour_floor(now)
    windows = {
        "hour": Period(hour, hour + rules.HOUR),
        "day": Period(hour - 23 * rules.HOUR, hour + rules.HOUR),
    }
    for window, period in windows.items():
        clusters = ledgers_by_id(
            await ledger_queries.cluster_sums(session, period.start, period.end, ids)
        )
        cluster_names = await ledger_queries.cluster_names(session, list(clusters))
        for cluster_id, ledger in sorted(clusters.items()):
            out.ledger("cluster", cluster_names.get(cluster_id, str(cluster_id)), window, ledger)
        for scope in ("workspace", "machine", "pool"):
            ledgers = ledgers_by_id(
                await ledger_queries.hour_sums(
                    session, scope, period.start, period.end, workspace_ids=ids
                )
            )
            scope_names = await ledger_queries.scope_names(session, scope, list(ledgers))
            for scope_id, ledger in sorted(ledgers.items()):
                out.ledger(scope, scope_names.get(scope_id, str(scope_id)), window, ledger)
    live = await ledger_queries.live_runs(session, ids)
    if live:
        since = min(rules.hour_floor(r.created_at) for r in live)
        runs_ = ledgers_by_id(
            await ledger_queries.hour_sums(
                session, "run", since, hour + rules.HOUR, scope_ids=[r.id for r in live]
            )
        )
        for run in sorted(live, key=lambda r: (names.get(r.workspace_id, ""), r.name)):
            if run.id in runs_:
                out.run(names.get(run.workspace_id, ""), run.name, runs_[run.id])
    stalled = await ledger_queries.stalled_workers(session, ids)
    slow = await ledger_queries.runs_with_straggler(session, ids, now - STRAGGLER_AFTER)
    for workspace_id, workspace in sorted(names.items(), key=lambda kv: kv[1]):
        out.add("astraeus_workers_stalled", {"namespace": workspace}, stalled.get(workspace_id, 0))
        out.add("astraeus_runs_with_straggler", {"namespace": workspace}, slow.get(workspace_id, 0))
    for cluster, unhealthy in await ledger_queries.unhealthy_gpus(
        session, principal.organization_id
    ):
        out.add("astraeus_gpus_unhealthy", {"cluster": cluster}, unhealthy)
    for metric, firing in (alerts_firing or {}).items():  # a cluster's operators only
        out.add("astraeus_threshold_alerts_firing", {"metric": metric}, firing)
    return out.text()


# -- the intervals behind a figure ---------------------------------------------------------------


async def explain(
    session: AsyncSession,
    viewer: Viewer,
    principal: Principal,
    *,
    by: str | None,
    name: str | None,
    category: str | None,
    period: Period,
    limit: int = 1000,
) -> list[Explained]:
    """The worker intervals that make a ledger figure: of one run, machine, pool or workspace
    (by name), maybe one category, over the period (DESIGN §4, invariant 4)."""
    scope = _by(by)
    problems = []
    if category is not None and category not in {c.value for c in Category}:
        problems.append(FieldError("category", "must be one of " + ", ".join(Category)))
    if name is None or name == "":
        problems.append(FieldError("name", "is required: the run, machine, pool or workspace"))
    if problems:
        raise InvalidInput("INVALID_PARAMETER", problems)
    assert name is not None
    scope_id = await ledger_queries.scope_id(
        session, scope, name, principal.organization_id, viewer.workspace_ids
    )
    if scope_id is None:
        raise NotFound("NOT_FOUND", f"No {scope} named '{name}'.")
    filters: dict[str, int] = {f"{scope}_id": scope_id} if scope != "workspace" else {}
    workspace_ids = viewer.workspace_ids
    if scope == "workspace":
        workspace_ids = [i for i in (workspace_ids or [scope_id]) if i == scope_id]
    rows = await ledger_queries.intervals_of(
        session,
        start=period.start,
        end=period.end,
        workspace_ids=workspace_ids,
        cluster_id=viewer.cluster_id,
        category=category,
        limit=limit,
        **filters,
    )
    machines = await ledger_queries.scope_names(
        session, "machine", [r.machine_id for r in rows if r.machine_id is not None]
    )
    run_names = await ledger_queries.scope_names(session, "run", [r.run_id for r in rows])
    out = []
    for r in rows:
        start, end = max(r.start_at, period.start), min(r.end_at, period.end)
        out.append(
            Explained(
                worker=r.worker_name,
                run=run_names.get(r.run_id),
                machine=machines.get(r.machine_id) if r.machine_id is not None else None,
                start=start,
                end=end,
                category=r.category,
                held=r.held,
                gpus=r.gpus,
                gpu_hours=(end - start).total_seconds() * r.gpus / 3600,
            )
        )
    return out


MAX_INTERVALS = 10_000


def interval_limit(raw: str | int | None) -> int:
    """How many intervals an explanation lists: 1 000 by default, at most 10 000."""
    if raw is None or raw == "":
        return 1000
    limit = whole_number(raw, 1, MAX_INTERVALS)
    if limit is None:
        raise InvalidInput(
            "INVALID_PARAMETER",
            [FieldError("limit", f"must be a whole number from 1 to {MAX_INTERVALS}")],
        )
    return limit


@dataclass(frozen=True)
class Explained:
    """A worker interval behind a figure, cut to the period asked."""

    worker: str
    run: str | None
    machine: str | None
    start: datetime
    end: datetime
    category: str
    held: bool
    gpus: int
    gpu_hours: float

    def to_json(self) -> dict[str, object]:
        return {
            "worker": self.worker,
            "run": self.run,
            "machine": self.machine,
            "start": iso_z(self.start),
            "end": iso_z(self.end),
            "category": self.category,
            "held": self.held,
            "gpus": self.gpus,
            "gpu_hours": self.gpu_hours,
        }


RETENTION = timedelta(days=400)


async def prune(session: AsyncSession, clock: Clock) -> tuple[int, int]:
    """The hourly ledgers and their intervals are kept 400 days (seed G-43), then deleted:
    from the whole hour 400 days ago, so a retried prune deletes nothing more."""
    return await ledger_writes.prune(session, rules.hour_floor(clock.now() - RETENTION))
