"""All SQL of goodput accounting's writes: the tick's mark, the workers' history it counts,
the open and closed intervals, the hourly and daily cells, the runs' running totals, pruning.
The reports' reads are in backend/accounting/ledger_queries.py."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    any_,
    bindparam,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting.rules import CATEGORIES, HOUR, WINDING_DOWN, PhaseChange
from backend.db import UTCDateTime, driver_connection, insert_many
from backend.metrics.rules import BY_NAME
from backend.models import (
    AccountingMark,
    GoodputDay,
    GoodputHour,
    GoodputInterval,
    GoodputOpenInterval,
    GoodputRecount,
    GoodputRunTotal,
    Machine,
    MetricSample,
    Run,
    StateTransition,
    Worker,
)
from backend.models.goodput import TOTAL_COLUMNS

T = TypeVar("T")
UTILIZATION = BY_NAME["task_gpu_utilization_ratio"].id
MARK_ID = 1


async def lock_mark(session: AsyncSession, now: datetime) -> AccountingMark:
    """The tick's mark, locked for this transaction: one tick counts at a time.

    The first statement writes the row: PostgreSQL locks it until commit (a concurrent tick
    waits, then sees the new mark); SQLite takes its one write lock."""
    updated = await session.execute(
        update(AccountingMark).where(AccountingMark.id == MARK_ID).values(ticked_at=now)
    )
    if not updated.rowcount:  # type: ignore[attr-defined]
        session.add(AccountingMark(id=MARK_ID, counted_until=None, ticked_at=now))
        await session.flush()
    mark = await session.get(AccountingMark, MARK_ID, populate_existing=True)
    assert mark is not None
    return mark


@dataclass(frozen=True)
class Unaccounted:
    """Transitions the tick has not counted around yet: their ids, and each worker's earliest."""

    ids: list[int]
    earliest: dict[int, datetime]


_UNACCOUNTED = select(
    StateTransition.id, StateTransition.worker_id, StateTransition.transition_at
).where(StateTransition.accounted.is_(False))


def _gather(found: Unaccounted, rows: Iterable[Any]) -> None:
    for id_, worker_id, at in rows:
        found.ids.append(id_)
        earliest = found.earliest
        if worker_id is not None and (worker_id not in earliest or at < earliest[worker_id]):
            earliest[worker_id] = at


async def unaccounted(session: AsyncSession, before: datetime) -> Unaccounted:
    """The transitions before ``before`` not counted yet (the partial index holds only them)."""
    found = Unaccounted([], {})
    _gather(
        found, await session.execute(_UNACCOUNTED.where(StateTransition.transition_at < before))
    )
    return found


async def unaccounted_of(session: AsyncSession, worker_ids: Sequence[int]) -> Unaccounted:
    """These workers' transitions not counted yet, whenever they are dated."""
    found = Unaccounted([], {})
    dialect = _dialect(session)
    for chunk in _batches(worker_ids, dialect):
        query = _UNACCOUNTED.where(_in(StateTransition.worker_id, chunk, dialect))
        _gather(found, await session.execute(query))
    return found


async def hold_mark(session: AsyncSession) -> datetime | None:
    """How far the tick has counted, with its mark locked until commit (no tick counts
    meanwhile; on SQLite the transaction already holds the one write lock)."""
    query = select(AccountingMark.counted_until).where(AccountingMark.id == MARK_ID)
    if _dialect(session) == "postgresql":
        query = query.with_for_update()
    return await session.scalar(query)


async def mark_accounted(session: AsyncSession, ids: Sequence[int]) -> None:
    """The transitions the tick read are counted. By id, not by time: one committed while the
    tick ran (dated before its end) stays to be counted by the next tick."""
    dialect = _dialect(session)
    for chunk in _chunks(ids, 100_000 if dialect == "postgresql" else 500):
        await session.execute(
            update(StateTransition)
            .where(_in(StateTransition.id, chunk, dialect))
            .values(accounted=True)
        )


async def share_mark(session: AsyncSession) -> datetime | None:
    """How far the tick has counted, the mark held shared until commit on PostgreSQL: a tick
    under way is waited for (its mark is then read), and a tick that starts after waits for
    this transaction (and then reads what it wrote). SQLite writes one transaction at a time."""
    query = select(AccountingMark.counted_until).where(AccountingMark.id == MARK_ID)
    if _dialect(session) == "postgresql":
        query = query.with_for_update(read=True)
    return await session.scalar(query)


async def placed_on(session: AsyncSession, machine_id: int, worker_ids: Sequence[int]) -> set[int]:
    """Those of the workers placed on the machine now."""
    rows = await session.scalars(
        select(Worker.id).where(Worker.machine_id == machine_id, Worker.id.in_(list(worker_ids)))
    )
    return set(rows)


async def add_recounts(session: AsyncSession, since: dict[int, datetime]) -> None:
    """Ask the tick to count these workers again, each from its moment."""
    if since:
        session.add_all(GoodputRecount(worker_id=w, since=at) for w, at in since.items())
        await session.flush()


async def recounts(session: AsyncSession, worker_ids: Sequence[int] | None = None) -> Unaccounted:
    """The recounts asked for (of these workers; None: all): their ids, and each worker's
    earliest moment."""
    found = Unaccounted([], {})
    query = select(GoodputRecount.id, GoodputRecount.worker_id, GoodputRecount.since)
    if worker_ids is None:
        _gather(found, await session.execute(query))
        return found
    dialect = _dialect(session)
    for chunk in _batches(worker_ids, dialect):
        rows = await session.execute(query.where(_in(GoodputRecount.worker_id, chunk, dialect)))
        _gather(found, rows)
    return found


async def recounted(session: AsyncSession, ids: Sequence[int]) -> None:
    """The recounts the tick read are done. By id: one asked for while it ran stays."""
    dialect = _dialect(session)
    for chunk in _chunks(ids, 100_000 if dialect == "postgresql" else 500):
        await session.execute(delete(GoodputRecount).where(_in(GoodputRecount.id, chunk, dialect)))


async def winding_down(session: AsyncSession) -> list[int]:
    """The workers the tick last counted winding down (productive for at most the stop's
    grace period: counted from their history, not carried on as they were)."""
    query = select(GoodputOpenInterval.worker_id).where(
        GoodputOpenInterval.phase.in_([str(p) for p in WINDING_DOWN])
    )
    return list(await session.scalars(query))


async def open_intervals(
    session: AsyncSession, worker_ids: Sequence[int] | None = None
) -> dict[int, GoodputOpenInterval]:
    """The open intervals of these workers (of every worker: None)."""
    query = select(GoodputOpenInterval)
    if worker_ids is None:
        return {o.worker_id: o for o in await session.scalars(query)}
    out: dict[int, GoodputOpenInterval] = {}
    dialect = _dialect(session)
    for chunk in _batches(worker_ids, dialect):
        rows = await session.scalars(
            query.where(_in(GoodputOpenInterval.worker_id, chunk, dialect))
        )
        out.update({o.worker_id: o for o in rows})
    return out


async def delete_open(session: AsyncSession, worker_ids: Sequence[int]) -> None:
    dialect = _dialect(session)
    for chunk in _batches(worker_ids, dialect):
        await session.execute(
            delete(GoodputOpenInterval).where(_in(GoodputOpenInterval.worker_id, chunk, dialect))
        )


async def add_open(session: AsyncSession, rows: list[dict[str, Any]]) -> None:
    await insert_many(session, GoodputOpenInterval, rows)


async def orphans(session: AsyncSession) -> list[GoodputOpenInterval]:
    """Open intervals of workers deleted (with their run) since the last tick."""
    gone = ~select(Worker.id).where(Worker.id == GoodputOpenInterval.worker_id).exists()
    return list(await session.scalars(select(GoodputOpenInterval).where(gone)))


async def closed_intervals_after(
    session: AsyncSession, moments: dict[int, datetime]
) -> list[GoodputInterval]:
    """Each worker's closed intervals that end after its moment."""
    out: list[GoodputInterval] = []
    since = min(moments.values(), default=None)
    if since is None:
        return out
    dialect = _dialect(session)
    for chunk in _batches(list(moments), dialect):
        rows = await session.scalars(
            select(GoodputInterval).where(
                _in(GoodputInterval.worker_id, chunk, dialect), GoodputInterval.end_at > since
            )
        )
        out += [r for r in rows if r.end_at > moments[r.worker_id]]
    return out


async def cut_intervals(session: AsyncSession, moments: dict[int, datetime]) -> None:
    """Forget each worker's closed intervals from its moment on (they are counted again)."""
    for worker_id, moment in moments.items():
        mine = GoodputInterval.worker_id == worker_id
        await session.execute(
            delete(GoodputInterval).where(mine, GoodputInterval.start_at >= moment)
        )
        await session.execute(
            update(GoodputInterval)
            .where(mine, GoodputInterval.end_at > moment)
            .values(end_at=moment)
        )


async def phase_histories(
    session: AsyncSession, worker_ids: Sequence[int], until: datetime
) -> dict[int, list[PhaseChange]]:
    """Each worker's phase changes before ``until``, in order; of two at one moment the later
    recorded holds."""
    out: dict[int, list[PhaseChange]] = {w: [] for w in worker_ids}
    dialect = _dialect(session)
    for chunk in _batches(worker_ids, dialect):
        rows = await session.execute(
            select(
                StateTransition.worker_id,
                StateTransition.transition_at,
                StateTransition.phase,
                StateTransition.gpus,
                StateTransition.machine_id,
            )
            .where(
                _in(StateTransition.worker_id, chunk, dialect),
                StateTransition.phase.is_not(None),
                StateTransition.transition_at < until,
            )
            .order_by(StateTransition.worker_id, StateTransition.transition_at, StateTransition.id)
        )
        for r in rows:
            changes = out[r.worker_id]
            change = PhaseChange(r.transition_at, r.phase, r.gpus, r.machine_id)
            if changes and changes[-1].at == change.at:
                changes[-1] = change
            else:
                changes.append(change)
    return out


def _add_cells(table: str, time: str) -> str:
    """Add the ``cells`` of the statement to a ledger (hourly or daily) at ``%(time)s``."""
    key = "workspace_id, cluster_id, scope, scope_id, category, held"
    return (
        f"INSERT INTO {table} ({time}, {key}, gpu_seconds) "
        f"SELECT %({time})s, {key}, gpu_seconds FROM cells "
        f"ON CONFLICT ({time}, {key}) "
        f"DO UPDATE SET gpu_seconds = {table}.gpu_seconds + excluded.gpu_seconds"
    )


# The minute of every worker without a change, in one statement (PostgreSQL): its category by
# its phase (running: by the minute's mean utilisation), its open interval carried on or
# closed and a new one opened, its cells added to the hourly and daily ledgers.
_STEADY_MINUTE_SQL = """
WITH busy AS (
  SELECT worker_id, avg(value) AS mean FROM metric_samples
  WHERE metric = %(metric)s AND ts >= %(start_ms)s AND ts < %(end_ms)s
  GROUP BY worker_id
), counted AS (
  SELECT o.worker_id, o.worker_name, o.run_id, o.workspace_id, o.cluster_id, o.gpus, o.held,
    o.machine_id, o.start_at, o.category AS was_category, o.pool_id AS was_pool,
    CASE WHEN o.phase <> 'running' THEN o.category
      WHEN b.mean >= %(busy)s THEN 'productive' ELSE 'idle' END AS category,
    m.pool_id
  FROM goodput_open_intervals o
  LEFT JOIN machines m ON m.id = o.machine_id
  LEFT JOIN busy b ON b.worker_id = o.worker_id
  WHERE o.worker_id <> ALL(%(changed)s::bigint[])
), moved AS (
  SELECT * FROM counted
  WHERE NOT %(same_hour)s OR category <> was_category OR pool_id IS DISTINCT FROM was_pool
), closed AS (
  INSERT INTO goodput_intervals (worker_id, worker_name, run_id, workspace_id, cluster_id,
    machine_id, pool_id, start_at, end_at, category, held, gpus)
  SELECT worker_id, worker_name, run_id, workspace_id, cluster_id, machine_id, was_pool,
    start_at, %(start)s, was_category, held, gpus FROM moved
  RETURNING 1
), opened AS (
  UPDATE goodput_open_intervals o
  SET start_at = %(start)s, category = v.category, pool_id = v.pool_id
  FROM moved v WHERE o.worker_id = v.worker_id
), cells AS (
  SELECT c.workspace_id, c.cluster_id, x.scope, x.scope_id, c.category, c.held,
    sum(c.gpus)::float8 * %(seconds)s AS gpu_seconds
  FROM counted c CROSS JOIN LATERAL (VALUES ('run', c.run_id), ('workspace', c.workspace_id),
    ('machine', c.machine_id), ('pool', c.pool_id)) AS x(scope, scope_id)
  WHERE x.scope_id IS NOT NULL
  GROUP BY 1, 2, 3, 4, 5, 6
), hours AS ({hours}), days AS ({days})
SELECT (SELECT count(*) FROM counted), (SELECT count(*) FROM closed),
  array_agg(run_id), array_agg(workspace_id), array_agg(cluster_id)
FROM (SELECT DISTINCT run_id, workspace_id, cluster_id FROM counted) AS runs
"""
_STEADY_MINUTE = _STEADY_MINUTE_SQL.format(
    hours=_add_cells("goodput_hours", "hour"), days=_add_cells("goodput_days", "day")
)


async def count_steady_minute(
    session: AsyncSession, minute: datetime, changed: Sequence[int], busy: float
) -> tuple[int, int]:
    """Count the minute from ``minute`` of every worker with an open interval but those
    ``changed`` (PostgreSQL): how many workers, and how many intervals it closed."""
    end = minute + timedelta(minutes=1)
    pg = await driver_connection(session)
    cursor = await pg.execute(
        _STEADY_MINUTE,
        {
            "metric": UTILIZATION,
            "start_ms": int(minute.timestamp() * 1000),
            "end_ms": int(end.timestamp() * 1000),
            "busy": busy,
            "changed": list(changed),
            "same_hour": minute.minute != 0,
            "start": minute,
            "seconds": 60.0,
            "hour": minute.replace(minute=0),
            "day": minute.replace(hour=0, minute=0),
        },
    )
    row = await cursor.fetchone()
    assert row is not None
    counted, closed, runs, workspaces, clusters = row
    hour = minute.replace(minute=0)
    await refresh_run_totals(
        session,
        {
            run: RunTouch(workspace, cluster, hour, hour)
            for run, workspace, cluster in zip(
                runs or [], workspaces or [], clusters or [], strict=True
            )
        },
    )
    return int(counted), int(closed)


async def minute_utilization(
    session: AsyncSession, worker_ids: Sequence[int], start: datetime, end: datetime
) -> dict[tuple[int, int], float]:
    """Mean GPU utilisation by (worker, minute as epoch ms) over [start, end), all its GPUs."""
    start_ms = int(start.timestamp() * 1000) // 60_000 * 60_000
    end_ms = int(end.timestamp() * 1000)
    out: dict[tuple[int, int], float] = {}
    dialect = _dialect(session)
    for chunk in _batches(worker_ids, dialect):
        bucket = func.floor(MetricSample.ts / 60_000)
        rows = await session.execute(
            select(MetricSample.worker_id, bucket.label("minute"), func.avg(MetricSample.value))
            .where(
                _in(MetricSample.worker_id, chunk, dialect),
                MetricSample.metric == UTILIZATION,
                MetricSample.ts >= start_ms,
                MetricSample.ts < end_ms,
            )
            .group_by(MetricSample.worker_id, bucket)
        )
        for worker_id, minute_, mean in rows:
            out[(worker_id, int(minute_) * 60_000)] = float(mean)
    return out


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    run_id: int
    workspace_id: int
    cluster_id: int


async def worker_info(session: AsyncSession, worker_ids: Sequence[int]) -> dict[int, WorkerInfo]:
    out = {}
    dialect = _dialect(session)
    for chunk in _batches(worker_ids, dialect):
        rows = await session.execute(
            select(Worker.id, Worker.name, Worker.run_id, Run.workspace_id, Run.cluster_id)
            .join(Run, Run.id == Worker.run_id)
            .where(_in(Worker.id, chunk, dialect))
        )
        out.update({r.id: WorkerInfo(r.name, r.run_id, r.workspace_id, r.cluster_id) for r in rows})
    return out


async def machine_pools(session: AsyncSession) -> dict[int, int | None]:
    rows = await session.execute(select(Machine.id, Machine.pool_id))
    return {r.id: r.pool_id for r in rows}


async def add_intervals(session: AsyncSession, rows: list[dict[str, Any]]) -> None:
    """Many rows a tick (one per live worker): COPY on PostgreSQL."""
    await insert_many(session, GoodputInterval, rows)


# A ledger cell: hour (or day), workspace, cluster, scope, scope id, category, held.
CellKey = tuple[datetime, int, int, str, int, str, bool]
CELL_COLUMNS = ["workspace_id", "cluster_id", "scope", "scope_id", "category", "held"]


async def add_to_hours(session: AsyncSession, cells: dict[CellKey, float]) -> None:
    """Add GPU-seconds to the hourly cells and to their days (negative to take back); cells
    emptied by a take-back go."""
    if not cells:
        return
    days: dict[CellKey, float] = {}
    for (hour, workspace, cluster, scope, scope_id, category, held), seconds in cells.items():
        key = (hour.replace(hour=0), workspace, cluster, scope, scope_id, category, held)
        days[key] = days.get(key, 0.0) + seconds
    await _upsert(session, GoodputHour, "hour", cells)
    await _upsert(session, GoodputDay, "day", days)
    if any(seconds < 0 for seconds in cells.values()):
        since = min(hour for hour, *_ in cells)
        for model, column in ((GoodputHour, GoodputHour.hour), (GoodputDay, GoodputDay.day)):
            await session.execute(
                delete(model).where(
                    column >= since.replace(hour=0), func.abs(model.gpu_seconds) < 1e-6
                )
            )
    touched: dict[int, RunTouch] = {}
    for hour, workspace, cluster, scope, scope_id, *_ in cells:
        if scope == "run":
            touched[scope_id] = _touch(touched.get(scope_id), workspace, cluster, hour)
    await refresh_run_totals(session, touched)


@dataclass(frozen=True)
class RunTouch:
    """A run whose hourly cells changed: its workspace and cluster, and the first and last
    hours that changed."""

    workspace_id: int
    cluster_id: int
    first: datetime
    last: datetime


def _touch(touch: RunTouch | None, workspace: int, cluster: int, hour: datetime) -> RunTouch:
    if touch is None:
        return RunTouch(workspace, cluster, hour, hour)
    return RunTouch(workspace, cluster, min(touch.first, hour), max(touch.last, hour))


_TIME = UTCDateTime()
# A run's cells of an hour as the columns of its running totals (GROUP BY the run and hour).
RUN_CELL_SUMS = ", ".join(
    f"sum(CASE WHEN category = '{category.value}' AND {held} THEN gpu_seconds ELSE 0 END) "
    f"AS {category.value}_{part}"
    for part, held in (("held", "held"), ("not_held", "NOT held"))
    for category in CATEGORIES
)
_TOTAL_HOUR = f"""
WITH keys AS ({{keys}}), cells AS (
  SELECT scope_id AS run_id, {RUN_CELL_SUMS} FROM goodput_hours
  WHERE hour = :hour AND scope = 'run' AND scope_id IN (SELECT run_id FROM keys)
  GROUP BY scope_id
)
INSERT INTO goodput_run_totals (run_id, hour, workspace_id, cluster_id, last,
  {", ".join(TOTAL_COLUMNS)})
SELECT k.run_id, :hour, k.workspace_id, k.cluster_id, k.last,
  {", ".join(f"coalesce(p.{c}, 0) + coalesce(c.{c}, 0)" for c in TOTAL_COLUMNS)}
FROM keys k
LEFT JOIN goodput_run_totals p ON p.run_id = k.run_id AND p.hour = :before
LEFT JOIN cells c ON c.run_id = k.run_id
WHERE true
ON CONFLICT (run_id, hour) DO UPDATE SET last = excluded.last,
  {", ".join(f"{c} = excluded.{c}" for c in TOTAL_COLUMNS)}
"""
_NOT_LAST = """
WITH keys AS ({keys})
UPDATE goodput_run_totals SET last = false
WHERE hour = :before AND last AND run_id IN (SELECT run_id FROM keys)
"""
_LAST_ROWS = """
WITH keys AS ({keys})
SELECT run_id, hour FROM goodput_run_totals
WHERE last AND run_id IN (SELECT run_id FROM keys)
"""
_KEYS = {
    "postgresql": "SELECT * FROM unnest(CAST(:runs AS bigint[]), CAST(:workspaces AS bigint[]), "
    "CAST(:clusters AS bigint[]), CAST(:lasts AS boolean[])) "
    "AS k(run_id, workspace_id, cluster_id, last)",
    "sqlite": "SELECT json_extract(value, '$[0]') AS run_id, "
    "json_extract(value, '$[1]') AS workspace_id, json_extract(value, '$[2]') AS cluster_id, "
    "json_extract(value, '$[3]') AS last FROM json_each(:keys)",
}


def _keys(dialect: str, keys: Sequence[tuple[int, int, int, bool]]) -> dict[str, Any]:
    """The parameters of _KEYS: (run, workspace, cluster, last) each."""
    if dialect == "postgresql":
        runs, workspaces, clusters, lasts = (list(column) for column in zip(*keys, strict=True))
        return {"runs": runs, "workspaces": workspaces, "clusters": clusters, "lasts": lasts}
    return {"keys": json.dumps(keys)}


async def refresh_run_totals(session: AsyncSession, touched: dict[int, RunTouch]) -> None:
    """Bring the running totals of the ``touched`` runs (GoodputRunTotal) in line with their
    hourly cells: every hour from the first that changed (or from the hour after the run's
    last row, where hours were skipped) to the last of its rows or changes, each the hour
    before plus its cells. Set-based: one statement an hour, whatever the number of runs (a
    tick: one hour; after an outage or a stall found late: a few)."""
    if not touched:
        return
    dialect = _dialect(session)
    lasts: dict[int, datetime] = {}
    for runs in _chunks(sorted(touched)):
        rows = await session.execute(
            text(_LAST_ROWS.format(keys=_KEYS[dialect])).columns(hour=_TIME),
            _keys(dialect, [(run, 0, 0, False) for run in runs]),
        )
        lasts.update({r[0]: r[1] for r in rows})
    spans: dict[int, tuple[RunTouch, datetime, datetime]] = {}
    for run, touch in touched.items():
        last = lasts.get(run)
        first = touch.first if last is None else min(touch.first, last + HOUR)
        spans[run] = (touch, first, touch.last if last is None else max(touch.last, last))
    upsert = text(_TOTAL_HOUR.format(keys=_KEYS[dialect])).bindparams(
        bindparam("hour", type_=_TIME), bindparam("before", type_=_TIME)
    )
    not_last = text(_NOT_LAST.format(keys=_KEYS[dialect])).bindparams(
        bindparam("before", type_=_TIME)
    )
    hour = min(first for _, first, _ in spans.values())
    end = max(last for _, _, last in spans.values())
    while hour <= end:
        in_force = [
            (run, touch.workspace_id, touch.cluster_id, hour == last)
            for run, (touch, first, last) in spans.items()
            if first <= hour <= last
        ]
        for chunk in _chunks(in_force, 50_000 if dialect == "postgresql" else 5000):
            params = {**_keys(dialect, chunk), "hour": hour, "before": hour - HOUR}
            await session.execute(upsert, params)
            await session.execute(not_last, params)
        hour += HOUR


async def _upsert(
    session: AsyncSession,
    model: type[GoodputHour] | type[GoodputDay],
    time: str,
    cells: dict[CellKey, float],
) -> None:
    if session.get_bind().dialect.name == "postgresql":
        await _upsert_arrays(session, model.__tablename__, time, cells)
        return
    rows = [
        {time: moment, **dict(zip(CELL_COLUMNS, rest, strict=True)), "gpu_seconds": seconds}
        for (moment, *rest), seconds in cells.items()
    ]
    upsert = sqlite_insert
    statement = upsert(model)
    statement = statement.on_conflict_do_update(
        index_elements=[time, *CELL_COLUMNS],
        set_={"gpu_seconds": model.gpu_seconds + statement.excluded.gpu_seconds},
    )
    for chunk in _chunks(rows, 1000):
        await session.execute(statement, list(chunk))


_ARRAY_TYPES = ("timestamptz", "bigint", "bigint", "text", "bigint", "text", "boolean", "float8")


async def _upsert_arrays(
    session: AsyncSession, table: str, time: str, cells: dict[CellKey, float]
) -> None:
    """One statement for every cell: the columns as arrays, unnested (PostgreSQL). Tens of
    thousands of cells a tick would otherwise be as many statements."""
    columns = [time, *CELL_COLUMNS, "gpu_seconds"]
    values: list[list[Any]] = [[] for _ in columns]
    for key, seconds in cells.items():
        for i, value in enumerate((*key, seconds)):
            values[i].append(value)
    arrays = ", ".join(f"%s::{t}[]" for t in _ARRAY_TYPES)
    statement = (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({arrays}) "
        f"ON CONFLICT ({', '.join(columns[:-1])}) "
        f"DO UPDATE SET gpu_seconds = {table}.gpu_seconds + excluded.gpu_seconds"
    )
    pg = await driver_connection(session)
    await pg.execute(statement, values)


def _in(column: Any, ids: Sequence[int], dialect: str) -> Any:
    """``column IN ids``: one array parameter on PostgreSQL (a list of 100 000 placeholders
    costs more to prepare than the query takes), placeholders on SQLite."""
    if dialect == "postgresql":
        return column == any_(bindparam(None, list(ids), type_=ARRAY(BigInteger)))
    return column.in_(ids)


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


def _batches(ids: Sequence[int], dialect: str) -> list[list[int]]:
    """All at once as one array on PostgreSQL; in slices under SQLite's parameter limit."""
    return [list(ids)] if dialect == "postgresql" else _chunks(ids)


def _chunks(items: Iterable[T], size: int = 5000) -> list[list[T]]:
    seq = list(items)
    return [seq[i : i + size] for i in range(0, len(seq), size)]


async def prune(session: AsyncSession, before: datetime) -> tuple[int, int]:
    """Delete ledger hours (and whole days) and intervals older than ``before``; how many
    hours and intervals. The runs' running totals keep the hour before ``before``: a period
    from there on is the difference of two rows."""
    hours = await session.execute(delete(GoodputHour).where(GoodputHour.hour < before))
    totals = GoodputRunTotal.__table__
    await session.execute(delete(totals).where(totals.c.hour < before - HOUR))
    await session.execute(delete(GoodputDay).where(GoodputDay.day < before.replace(hour=0)))
    intervals = await session.execute(
        delete(GoodputInterval).where(GoodputInterval.end_at <= before)
    )
    return int(hours.rowcount), int(intervals.rowcount)  # type: ignore[attr-defined]
