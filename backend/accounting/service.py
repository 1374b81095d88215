"""Goodput accounting's entry point: the tick that counts workers' time into the ledgers.

The tick counts whole UTC minutes: everything before the last minute boundary that was not
counted yet (one minute normally; an hour after an outage). It adds to the hourly and daily
ledgers, keeps what it counted as intervals (the explanation of every ledger figure) and
moves its mark, in one transaction, so a retried, late, duplicated or concurrent tick never
counts a second twice nor skips one.

Each live worker has an open interval (goodput_open_intervals) that ends at the mark, with the
phase the tick last counted it in. A worker without a new transition stays in that phase: on
PostgreSQL one statement a minute counts all of them (categories, cells, intervals closed and
opened where the category changes), with no loop over workers. A worker with transitions not
counted yet is counted by the pure rules from its history, from the earliest of them: one
recorded after its time had been counted (a stall found after the fact and dated back to the
worker's last progress) takes back what was counted of that worker from then, and counts it
again (DESIGN §4, invariant 3). On SQLite every worker is counted the second way.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
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
    PhaseChange,
    iso_week,
    parse_period,
    week_start,
)
from backend.clock import Clock, iso_z
from backend.errors import FieldError, InvalidInput, NotFound
from backend.lifecycle.rules import STRAGGLER_AFTER
from backend.models import GoodputInterval, GoodputOpenInterval, Run
from backend.organizations import service as organizations
from backend.runs import service as runs

WEEK = timedelta(weeks=1)


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
    mark = await repository.lock_mark(session, now)
    counted = mark.counted_until
    until = minute_floor(now) if counted is None else max(minute_floor(now), counted)
    pending = await repository.unaccounted(session, before=until)
    # Each worker with a transition not counted yet counts again from it (or from the mark).
    starts = {w: at if counted is None else min(at, counted) for w, at in pending.earliest.items()}
    if counted is None or counted >= until:
        mark.counted_until = until
        if not starts:  # the first tick, or one that came twice: nothing to count
            return TickResult(None, until)
    recounted = min(
        (s for s in starts.values() if counted is not None and s < counted), default=None
    )
    counted_from = min([*starts.values(), *([counted] if counted is not None else [])])
    closed = await _close_orphans(session, counted)
    workers, intervals = 0, closed
    if counted is not None and counted < until and _dialect(session) == "postgresql":
        # Workers without a change: set-based, minute by minute (one minute but after an outage).
        for minute in _minutes(counted, until):
            steady, moved = await repository.count_steady_minute(
                session, minute, list(starts), rules.BUSY_UTILIZATION
            )
            workers, intervals = max(workers, steady), intervals + moved
    elif counted is not None and counted < until:
        for worker_id in await repository.open_intervals(session):
            starts.setdefault(worker_id, counted)  # from its open interval, as above
    changed, written = await _count(session, starts, set(pending.earliest), counted, until)
    await repository.mark_accounted(session, pending.ids)
    mark.counted_until = until
    return TickResult(counted_from, until, recounted, workers + changed, intervals + written)


def _minutes(start: datetime, end: datetime) -> list[datetime]:
    return [start + i * rules.MINUTE for i in range(int((end - start) / rules.MINUTE))]


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


async def _close_orphans(session: AsyncSession, counted: datetime | None) -> int:
    """Workers deleted with their run since the last tick: their open interval ends at the
    mark (their time until then was counted)."""
    gone = await repository.orphans(session)
    if not gone or counted is None:
        return 0
    await repository.add_intervals(session, [_closed_row(o, counted) for o in gone])
    await repository.delete_open(session, [o.worker_id for o in gone])
    return len(gone)


def _closed_row(o: GoodputOpenInterval, end: datetime) -> dict[str, object]:
    return {
        "worker_id": o.worker_id,
        "worker_name": o.worker_name,
        "run_id": o.run_id,
        "workspace_id": o.workspace_id,
        "cluster_id": o.cluster_id,
        "machine_id": o.machine_id,
        "pool_id": o.pool_id,
        "start_at": o.start_at,
        "end_at": end,
        "category": o.category,
        "held": o.held,
        "gpus": o.gpus,
    }


@dataclass(frozen=True)
class _Piece:
    """An interval of a worker, with the pool of its machine: a ledger's and a row's unit."""

    interval: Interval
    pool: int | None

    def continues(self, other: _Piece) -> bool:
        a, b = self.interval, other.interval
        return (
            a.end == b.start
            and (a.category, a.held, a.gpus, a.machine_id, self.pool)
            == (b.category, b.held, b.gpus, b.machine_id, other.pool)
            and rules.hour_floor(a.start) == rules.hour_floor(b.start)
        )


async def _count(
    session: AsyncSession,
    starts: dict[int, datetime],
    from_history: set[int],
    counted: datetime | None,
    until: datetime,
) -> tuple[int, int]:
    """Count the workers of ``starts``, each from its moment, one by one by the pure rules:
    those with transitions not counted yet (from their history; what was counted from their
    moment on is taken back first), and on SQLite every worker. How many workers and intervals.
    """
    if not starts:
        return 0, 0
    ids = sorted(starts)
    opened = await repository.open_intervals(session, ids)
    history = await repository.phase_histories(session, sorted(from_history), until)
    info = await repository.worker_info(session, ids)
    pools = await repository.machine_pools(session)
    busy = await repository.minute_utilization(session, ids, min(starts.values()), until)
    cells: dict[repository.CellKey, float] = defaultdict(float)
    back = {w: at for w, at in starts.items() if counted is not None and at < counted}
    for row in await repository.closed_intervals_after(session, back):
        part = _as_interval(row, start=max(row.start_at, back[row.worker_id]))
        _add(cells, part, row, row.pool_id, -1)
    await repository.cut_intervals(session, back)
    rows: list[dict[str, object]] = []
    still_open: list[dict[str, object]] = []
    for worker_id in ids:
        start = starts[worker_id]
        before = opened.get(worker_id)
        previous = None  # the interval that ends where this count starts, which it may extend
        if before is not None:
            assert counted is not None
            if start < counted:  # taken back from ``start``
                part = _as_interval(before, start=max(before.start_at, start), end=counted)
                _add(cells, part, before, before.pool_id, -1)
            if before.start_at < start:
                previous = _Piece(
                    _as_interval(before, start=before.start_at, end=start), before.pool_id
                )
        worker = info.get(worker_id)
        if worker_id in from_history:
            changes = history.get(worker_id, [])
        elif before is not None:
            changes = [PhaseChange(start, before.phase, before.gpus, before.phase_machine_id)]
        else:
            changes = []
        if worker is None:  # deleted while the tick ran: its open interval ends where it was
            changes = []
            worker = repository.WorkerInfo("", 0, 0, 0)

        def utilisation(minute: datetime, _: datetime, w: int = worker_id) -> float | None:
            return busy.get((w, int(minute.timestamp()) * 1000))

        pieces = [
            _Piece(part, pools.get(part.machine_id) if part.machine_id is not None else None)
            for part in rules.intervals(changes, start, until, utilisation)
        ]
        for piece in pieces:
            _add(cells, piece.interval, worker, piece.pool, +1)
        if previous is not None and pieces and previous.continues(pieces[0]):
            first = pieces[0].interval
            pieces[0] = _Piece(
                Interval(
                    previous.interval.start,
                    first.end,
                    first.category,
                    first.held,
                    first.gpus,
                    first.machine_id,
                ),
                pieces[0].pool,
            )
        elif previous is not None and before is not None:
            rows.append(_row(previous, worker_id, _owner(before)))
        last = pieces[-1] if pieces and pieces[-1].interval.end == until else None
        in_force = [c for c in sorted(changes) if c.at < until]
        for piece in pieces:
            if piece is last:
                still_open.append(_open_row(piece, worker_id, worker, in_force[-1]))
            else:
                rows.append(_row(piece, worker_id, worker))
    await repository.delete_open(session, list(opened))
    await repository.add_intervals(session, rows)
    await repository.add_open(session, still_open)
    await repository.add_to_hours(session, cells)
    return len(ids), len(rows)


def _owner(row: GoodputInterval | GoodputOpenInterval) -> repository.WorkerInfo:
    return repository.WorkerInfo(row.worker_name, row.run_id, row.workspace_id, row.cluster_id)


def _add(
    cells: dict[repository.CellKey, float],
    part: Interval,
    owner: repository.WorkerInfo | GoodputInterval | GoodputOpenInterval,
    pool: int | None,
    sign: int,
) -> None:
    """Add (or take back) an interval in the ledger cells it counts in: its run's, its
    workspace's, its machine's and pool's (where it held GPUs on one)."""
    if not isinstance(owner, repository.WorkerInfo):
        owner = _owner(owner)
    hour = rules.hour_floor(part.start)
    scopes = [("run", owner.run_id), ("workspace", owner.workspace_id)]
    if part.machine_id is not None:
        scopes.append(("machine", part.machine_id))
    if pool is not None:
        scopes.append(("pool", pool))
    for scope, scope_id in scopes:
        cell = (
            hour,
            owner.workspace_id,
            owner.cluster_id,
            scope,
            scope_id,
            part.category.value,
            part.held,
        )
        cells[cell] += sign * part.gpu_seconds


def _as_interval(
    row: GoodputInterval | GoodputOpenInterval, *, start: datetime, end: datetime | None = None
) -> Interval:
    if end is None:
        assert isinstance(row, GoodputInterval)
        end = row.end_at
    return Interval(start, end, Category(row.category), row.held, row.gpus, row.machine_id)


def _row(piece: _Piece, worker_id: int, owner: repository.WorkerInfo) -> dict[str, object]:
    part = piece.interval
    return {
        "worker_id": worker_id,
        "worker_name": owner.name,
        "run_id": owner.run_id,
        "workspace_id": owner.workspace_id,
        "cluster_id": owner.cluster_id,
        "machine_id": part.machine_id,
        "pool_id": piece.pool,
        "start_at": part.start,
        "end_at": part.end,
        "category": part.category.value,
        "held": part.held,
        "gpus": part.gpus,
    }


def _open_row(
    piece: _Piece, worker_id: int, owner: repository.WorkerInfo, phase: PhaseChange
) -> dict[str, object]:
    row = _row(piece, worker_id, owner)
    del row["end_at"]  # it ends at the mark
    return {**row, "phase": phase.phase, "phase_machine_id": phase.machine_id}


# -- reading the ledgers -------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One ledger of a report: a run, machine, pool or workspace by its name, its GPU-seconds
    by category held and not (in the order of CATEGORIES)."""

    name: str
    held: Sequence[float]
    not_held: Sequence[float]

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
    ledgers = await repository.named_ledgers(
        session,
        scope,
        period.start,
        period.end,
        workspace_ids=viewer.workspace_ids,
        cluster_id=viewer.cluster_id,
    )
    rows = [Row(r.name, r.held, r.not_held) for r in ledgers]
    total = Ledger.of_columns(
        [math.fsum(column) for column in zip(*(r.held for r in ledgers), strict=True)],
        [math.fsum(column) for column in zip(*(r.not_held for r in ledgers), strict=True)],
    )
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
    sums = await repository.hour_sums(
        session, "run", since, until, scope_ids=[run_id for run_id, _ in found]
    )
    ledgers = ledgers_by_id(sums)
    return {run_id: ledgers.get(run_id) or Ledger.empty() for run_id, _ in found}


def weeks_of(raw: str | int | None) -> int:
    """How many weeks a weekly report covers: 8 by default, at most a period's 400 days."""
    if raw is None or raw == "":
        return 8
    text = str(raw)
    if not text.isdigit() or not 1 <= int(text) <= rules.MAX_WEEKS:
        raise InvalidInput(
            "INVALID_PARAMETER",
            [FieldError("weeks", f"must be a whole number from 1 to {rules.MAX_WEEKS}")],
        )
    return int(text)


# -- Prometheus ------------------------------------------------------------------------------------


def ledgers_by_id(sums: Iterable[tuple[int, str, bool, float]]) -> dict[int, Ledger]:
    parts: dict[int, list[tuple[str, bool, float]]] = defaultdict(list)
    for scope_id, category, held, seconds in sums:
        parts[scope_id].append((category, held, seconds))
    return {i: Ledger.of_sums(p) for i, p in parts.items()}


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
    text = str(raw)
    if not text.isdigit() or not 1 <= int(text) <= MAX_INTERVALS:
        raise InvalidInput(
            "INVALID_PARAMETER",
            [FieldError("limit", f"must be a whole number from 1 to {MAX_INTERVALS}")],
        )
    return int(text)


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
    return await repository.prune(session, rules.hour_floor(clock.now() - RETENTION))
