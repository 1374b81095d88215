"""Goodput accounting's entry point: the tick that counts workers' time into the ledgers.

The tick counts whole UTC minutes: everything before the last minute boundary that was not
counted yet (one minute normally; an hour after an outage). What it counted is kept as
intervals (the explanation of every ledger figure) and added to the hourly ledgers, in one
transaction with the mark of how far it counted, so a retried, late, duplicated or
concurrent tick never counts a second twice nor skips one.

A transition recorded after its time had been counted (a stall is found after the fact and
dated back to the worker's last progress) makes the tick take back what it had counted from
that time and count it again (DESIGN §4, invariant 3).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting import repository, rules
from backend.accounting.exposition import Exposition
from backend.accounting.rules import (
    SCOPES,
    Category,
    Interval,
    Ledger,
    Period,
    iso_week,
    parse_period,
    week_start,
)
from backend.clock import Clock, iso_z
from backend.errors import FieldError, InvalidInput, NotFound
from backend.lifecycle.rules import STRAGGLER_AFTER
from backend.models import GoodputInterval, Run
from backend.organizations import service as organizations
from backend.runs import service as runs

WEEK = timedelta(weeks=1)

# hour, workspace, cluster, scope, scope id, category, held
Cell = tuple[datetime, int, int, str, int, str, bool]


@dataclass(frozen=True)
class TickResult:
    counted_from: datetime | None
    counted_until: datetime | None
    recounted_from: datetime | None = None
    workers: int = 0
    intervals: int = 0


def minute_floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


async def tick(session: AsyncSession, clock: Clock) -> TickResult:
    """Count every worker's time up to the last whole minute."""
    now = clock.now()
    until = minute_floor(now)
    mark = await repository.lock_mark(session, now)
    counted = mark.counted_until
    late = await repository.earliest_unaccounted(session, before=until)
    start = counted if late is None else late if counted is None else min(counted, late)
    if start is None or start >= until:  # nothing to count (yet), or a tick came twice
        if counted is None:
            mark.counted_until = until
        return TickResult(None, mark.counted_until)
    recounted = start if counted is not None and start < counted else None
    if recounted is not None:
        await _take_back(session, recounted)
    workers, rows, cells = await _count(session, start, until)
    await repository.add_intervals(session, rows)
    await repository.add_to_hours(session, cells)
    await repository.mark_accounted(session, before=until)
    mark.counted_until = until
    return TickResult(start, until, recounted, workers, len(rows))


async def _take_back(session: AsyncSession, moment: datetime) -> None:
    """Subtract what was counted from ``moment`` on, and forget those intervals."""
    cells: dict[Cell, float] = defaultdict(float)
    for row in await repository.intervals_after(session, moment):
        part = _as_interval(row, start=max(row.start_at, moment))
        for cell in _cells(part, row.workspace_id, row.cluster_id, row.run_id, row.pool_id):
            cells[cell] -= part.gpu_seconds
    await repository.add_to_hours(session, cells)
    await repository.cut_intervals_at(session, moment)


async def _count(
    session: AsyncSession, start: datetime, until: datetime
) -> tuple[int, list[dict[str, object]], dict[Cell, float]]:
    worker_ids = await repository.workers_to_count(session, start, until)
    if not worker_ids:
        return 0, [], {}
    changes = await repository.phase_changes(session, worker_ids, start, until)
    busy = await repository.minute_utilization(session, worker_ids, start, until)
    info = await repository.worker_info(session, worker_ids)
    pools = await repository.machine_pools(session)
    rows: list[dict[str, object]] = []
    cells: dict[Cell, float] = defaultdict(float)
    for worker_id in worker_ids:
        worker = info.get(worker_id)
        if worker is None:
            continue  # deleted with its run while the tick ran: its time was counted before

        def utilisation(minute: datetime, _: datetime, w: int = worker_id) -> float | None:
            return busy.get((w, int(minute.timestamp()) * 1000))

        for part in rules.intervals(changes[worker_id], start, until, utilisation):
            pool = pools.get(part.machine_id) if part.machine_id is not None else None
            rows.append(
                {
                    "worker_id": worker_id,
                    "worker_name": worker.name,
                    "run_id": worker.run_id,
                    "workspace_id": worker.workspace_id,
                    "cluster_id": worker.cluster_id,
                    "machine_id": part.machine_id,
                    "pool_id": pool,
                    "start_at": part.start,
                    "end_at": part.end,
                    "category": part.category.value,
                    "held": part.held,
                    "gpus": part.gpus,
                }
            )
            cluster = worker.cluster_id
            for cell in _cells(part, worker.workspace_id, cluster, worker.run_id, pool):
                cells[cell] += part.gpu_seconds
    return len(worker_ids), rows, cells


def _cells(part: Interval, workspace: int, cluster: int, run: int, pool: int | None) -> list[Cell]:
    """The ledger cells an interval counts in: its run, its workspace, its machine and pool
    (where it held GPUs on one)."""
    hour = part.start.replace(minute=0, second=0, microsecond=0)
    key = (part.category.value, part.held)
    scopes = [("run", run), ("workspace", workspace)]
    if part.machine_id is not None:
        scopes.append(("machine", part.machine_id))
    if pool is not None:
        scopes.append(("pool", pool))
    return [(hour, workspace, cluster, scope, scope_id, *key) for scope, scope_id in scopes]


def _as_interval(row: GoodputInterval, *, start: datetime) -> Interval:
    return Interval(
        start, row.end_at, rules.Category(row.category), row.held, row.gpus, row.machine_id
    )


# -- reading the ledgers -------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One ledger of a report: a run, machine, pool or workspace by its name."""

    name: str
    ledger: Ledger


@dataclass(frozen=True)
class Report:
    by: str
    period: Period
    rows: list[Row]
    total: Ledger

    def to_json(self) -> dict[str, object]:
        return {
            "by": self.by,
            "start": iso_z(self.period.start),
            "end": iso_z(self.period.end),
            "ledgers": [{"name": r.name, **r.ledger.to_json()} for r in self.rows],
            "total": self.total.to_json(),
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
    if not principal.can_see_organization(org.id):
        raise NotFound("CLUSTER_NOT_FOUND", f"No cluster named '{cluster}'.")
    found = await organizations.cluster_by_name(session, org.id, cluster)
    return Viewer(None, found.id)


async def report(session: AsyncSession, viewer: Viewer, by: str | None, period: Period) -> Report:
    """A ledger per run, machine, pool or workspace over the period, and their total."""
    scope = _by(by)
    sums = await repository.named_sums(
        session,
        scope,
        period.start,
        period.end,
        workspace_ids=viewer.workspace_ids,
        cluster_id=viewer.cluster_id,
    )
    by_id: dict[int, list[tuple[str, bool, float]]] = defaultdict(list)
    names: dict[int, str] = {}
    for scope_id, name, category, held, seconds in sums:
        by_id[scope_id].append((category, held, seconds))
        names[scope_id] = name
    rows = [Row(names[i], _ledger(parts)) for i, parts in by_id.items()]
    rows.sort(key=lambda r: (-r.ledger.allocated, r.name))  # as the seed: most held first
    total = _ledger([p for parts in by_id.values() for p in parts])
    return Report(scope, period, rows, total)


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
    since = rules.hour_floor(run.created_at)
    until = rules.hour_floor(now) + rules.HOUR
    sums = await repository.hour_sums(session, "run", since, until, scope_ids=[run.id])
    return run, _ledger([(c, h, s) for _, c, h, s in sums])


def _ledger(parts: Iterable[tuple[str, bool, float]]) -> Ledger:
    held: dict[Category, float] = dict.fromkeys(Category, 0.0)
    not_held: dict[Category, float] = dict.fromkeys(Category, 0.0)
    for category, is_held, seconds in parts:
        (held if is_held else not_held)[Category(category)] += seconds
    return Ledger(held, not_held)


# -- Prometheus ------------------------------------------------------------------------------------


def ledgers_by_id(sums: Iterable[tuple[int, str, bool, float]]) -> dict[int, Ledger]:
    parts: dict[int, list[tuple[str, bool, float]]] = defaultdict(list)
    for scope_id, category, held, seconds in sums:
        parts[scope_id].append((category, held, seconds))
    return {i: _ledger(p) for i, p in parts.items()}


async def exposition(
    session: AsyncSession,
    principal: Principal,
    now: datetime,
    alerts_firing: dict[str, int] | None = None,
) -> str:
    """``GET /goodput/metrics``: what the caller may see, as Prometheus text.

    A workspace's token: its workspace, its share of the machines, pools and clusters it
    used, its runs still going. An organisation admin's: every workspace of the organisation."""
    names = await repository.workspaces(
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
            await repository.cluster_sums(session, period.start, period.end, ids)
        )
        cluster_names = await repository.cluster_names(session, list(clusters))
        for cluster_id, ledger in sorted(clusters.items()):
            out.ledger("cluster", cluster_names.get(cluster_id, str(cluster_id)), window, ledger)
        for scope in ("workspace", "machine", "pool"):
            ledgers = ledgers_by_id(
                await repository.hour_sums(
                    session, scope, period.start, period.end, workspace_ids=ids
                )
            )
            scope_names = await repository.scope_names(session, scope, list(ledgers))
            for scope_id, ledger in sorted(ledgers.items()):
                out.ledger(scope, scope_names.get(scope_id, str(scope_id)), window, ledger)
    live = await repository.live_runs(session, ids)
    if live:
        since = min(rules.hour_floor(r.created_at) for r in live)
        runs_ = ledgers_by_id(
            await repository.hour_sums(
                session, "run", since, hour + rules.HOUR, scope_ids=[r.id for r in live]
            )
        )
        for run in sorted(live, key=lambda r: (names.get(r.workspace_id, ""), r.name)):
            if run.id in runs_:
                out.run(names.get(run.workspace_id, ""), run.name, runs_[run.id])
    stalled = await repository.stalled_workers(session, ids)
    slow = await repository.runs_with_straggler(session, ids, now - STRAGGLER_AFTER)
    for workspace_id, workspace in sorted(names.items(), key=lambda kv: kv[1]):
        out.add("astraeus_workers_stalled", {"namespace": workspace}, stalled.get(workspace_id, 0))
        out.add("astraeus_runs_with_straggler", {"namespace": workspace}, slow.get(workspace_id, 0))
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
) -> list[dict[str, object]]:
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
    scope_id = await repository.scope_id(
        session, scope, name, principal.organization_id, viewer.workspace_ids
    )
    if scope_id is None:
        raise NotFound("NOT_FOUND", f"No {scope} named '{name}'.")
    filters: dict[str, int] = {f"{scope}_id": scope_id} if scope != "workspace" else {}
    workspace_ids = viewer.workspace_ids
    if scope == "workspace":
        workspace_ids = [i for i in (workspace_ids or [scope_id]) if i == scope_id]
    rows = await repository.intervals_of(
        session,
        start=period.start,
        end=period.end,
        workspace_ids=workspace_ids,
        cluster_id=viewer.cluster_id,
        category=category,
        limit=limit,
        **filters,
    )
    machines = await repository.scope_names(
        session, "machine", [r.machine_id for r in rows if r.machine_id is not None]
    )
    run_names = await repository.scope_names(session, "run", [r.run_id for r in rows])
    return [
        {
            "worker": r.worker_name,
            "run": run_names.get(r.run_id),
            "machine": machines.get(r.machine_id) if r.machine_id is not None else None,
            "start": iso_z(max(r.start_at, period.start)),
            "end": iso_z(min(r.end_at, period.end)),
            "category": r.category,
            "held": r.held,
            "gpus": r.gpus,
            "gpu_hours": (min(r.end_at, period.end) - max(r.start_at, period.start)).total_seconds()
            * r.gpus
            / 3600,
        }
        for r in rows
    ]


RETENTION = timedelta(days=400)


async def prune(session: AsyncSession, clock: Clock) -> tuple[int, int]:
    """The hourly ledgers and their intervals are kept 400 days (seed G-43), then deleted:
    from the whole hour 400 days ago, so a retried prune deletes nothing more."""
    return await repository.prune(session, rules.hour_floor(clock.now() - RETENTION))
