"""All SQL of goodput accounting."""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import (
    BigInteger,
    String,
    and_,
    any_,
    bindparam,
    delete,
    false,
    func,
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting.rules import CATEGORIES, HOUR, WINDING_DOWN, PhaseChange
from backend.db import UTCDateTime, driver_connection, insert_many
from backend.metrics.rules import BY_NAME
from backend.models import (
    AccountingMark,
    Cluster,
    GoodputDay,
    GoodputHour,
    GoodputInterval,
    GoodputOpenInterval,
    GoodputRecount,
    GoodputRunTotal,
    Machine,
    MetricSample,
    Pool,
    Run,
    StateTransition,
    Worker,
    Workspace,
)
from backend.models.goodput import TOTAL_COLUMNS
from backend.runs.rules import ENDED_RUN_STATES

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


async def hour_sums(
    session: AsyncSession,
    scope: str,
    start: datetime,
    end: datetime,
    *,
    workspace_ids: Sequence[int] | None = None,
    cluster_id: int | None = None,
    scope_ids: Sequence[int] | None = None,
) -> list[tuple[int, str, bool, float]]:
    """(scope id, category, held, GPU-seconds) summed over the hours of [start, end): whole
    UTC days from the daily cells, the hours at either end from the hourly ones; one query."""
    connection = await session.connection()  # Core rows: no ORM loading for 20 000 of them
    rows = await connection.execute(_sums(scope, start, end, workspace_ids, cluster_id, scope_ids))
    return [(r[0], r[1], bool(r[2]), float(r[3])) for r in rows]


class NamedLedger(NamedTuple):
    """A run's, machine's, pool's or workspace's GPU-seconds: by category held, and not held
    (in the order of rules.CATEGORIES). A tuple: a report over 10 000 runs makes as many."""

    scope_id: int
    name: str
    held: tuple[float, ...]
    not_held: tuple[float, ...]


async def named_ledgers(
    session: AsyncSession,
    scope: str,
    start: datetime,
    end: datetime,
    *,
    workspace_ids: Sequence[int] | None = None,
    cluster_id: int | None = None,
) -> list[NamedLedger]:
    """Each run's, machine's, pool's or workspace's ledger over the hours [start, end), with
    its name, most held first: one row each, the categories as columns (a 7-day report over
    10 000 runs reads 10 000 rows, not 20 000 or more)."""
    if scope == "run":
        # the running totals hold what the hourly cells add up to, pruned hours included:
        # the period starts where the cells still do, as when they are summed
        kept_from = await session.scalar(select(func.min(GoodputHour.hour)))
        if kept_from is None or max(start, kept_from) >= end:
            return []
        start = max(start, kept_from)
    connection = await session.connection()
    rows: Sequence[Sequence[Any]]
    if _dialect(session) != "postgresql":
        query = named_ledgers_query(scope, start, end, workspace_ids, cluster_id)
        rows = (await connection.execute(query)).all()
    elif scope == "run":
        # two index scans of a row a run: parallel workers take longer to start than they save
        await connection.exec_driver_sql("SET LOCAL max_parallel_workers_per_gather = 0")
        # psycopg's own tuples: SQLAlchemy's rows cost a fifth of a report over 10 000 runs
        # (no column here needs its result processing: ids, names and floats)
        pg = await driver_connection(session)
        workspaces = None if workspace_ids is None else len(workspace_ids)
        sql = _run_ledgers_sql(workspaces, cluster_id is not None)
        params = _run_ledgers_params(start, end, workspace_ids, cluster_id)
        rows = await (await pg.execute(sql, params)).fetchall()
    else:
        # PostgreSQL's JIT compiles the sixteen sums every time: about 30 ms of a 7-day report
        # by machine over 340 000 cells, more than it saves
        await connection.exec_driver_sql("SET LOCAL jit = off")
        query = named_ledgers_query(scope, start, end, workspace_ids, cluster_id)
        compiled = query.compile(
            dialect=connection.dialect, compile_kwargs={"render_postcompile": True}
        )
        pg = await driver_connection(session)  # its own tuples, as above
        rows = await (await pg.execute(str(compiled), compiled.params)).fetchall()
    n = len(CATEGORIES)
    return [NamedLedger(r[0], r[1], tuple(r[2 : 2 + n]), tuple(r[2 + n :])) for r in rows]


def named_ledgers_query(
    scope: str,
    start: datetime,
    end: datetime,
    workspace_ids: Sequence[int] | None,
    cluster_id: int | None,
) -> Any:
    """The statement of ``named_ledgers`` (the benchmarks run it bare). By run, from the
    runs' running totals: ``start`` must not be before the first hour the cells still have."""
    if scope == "run":
        return _run_ledgers_query(start, end, workspace_ids, cluster_id)
    sums = _sums(scope, start, end, workspace_ids, cluster_id, None).subquery()
    columns = [
        func.coalesce(
            func.sum(sums.c.gpu_seconds).filter(
                sums.c.category == category.value, sums.c.held.is_(held)
            ),
            0.0,
        )
        for held in (True, False)
        for category in CATEGORIES
    ]
    held_total = func.coalesce(func.sum(sums.c.gpu_seconds).filter(sums.c.held.is_(True)), 0.0)
    pivot = (
        select(sums.c.scope_id, held_total.label("held_total"), *columns)
        .group_by(sums.c.scope_id)
        .subquery()
    )
    model = _NAMED[scope]
    name = func.coalesce(model.name, func.cast(pivot.c.scope_id, String))
    return (
        select(pivot.c.scope_id, name, *list(pivot.c)[2:])
        .outerjoin(model, model.id == pivot.c.scope_id)  # a machine removed since: its id
        .order_by(pivot.c.held_total.desc(), name)  # as the seed: most held first
    )


def _run_ledgers_query(
    start: datetime, end: datetime, workspace_ids: Sequence[int] | None, cluster_id: int | None
) -> Any:
    """Each run's time in the whole hours [start, end), from its running totals: its row at
    end - 1 h (or its last, if it ended before) less its row at start - 1 h (none: it began
    in the period), the categories as columns; most held first."""
    statement = _run_ledgers_statement(
        None if workspace_ids is None else len(workspace_ids), cluster_id is not None
    )
    return statement.params(_run_ledgers_params(start, end, workspace_ids, cluster_id))


def _run_ledgers_params(
    start: datetime, end: datetime, workspace_ids: Sequence[int] | None, cluster_id: int | None
) -> dict[str, Any]:
    params: dict[str, Any] = {"start": start, "final": end - HOUR, "before": start - HOUR}
    params.update({f"workspace_{i}": w for i, w in enumerate(workspace_ids or ())})
    if cluster_id is not None:
        params["cluster"] = cluster_id
    return params


@functools.lru_cache(maxsize=64)
def _run_ledgers_statement(workspaces: int | None, by_cluster: bool) -> Any:
    """The statement of ``_run_ledgers_query`` with its values as parameters (start, final,
    before, workspace_0…, cluster): made and compiled once per shape, not per report."""
    totals = GoodputRunTotal.__table__
    mine: list[Any] = []
    if workspaces is not None:
        ids = [bindparam(f"workspace_{i}", type_=BigInteger) for i in range(workspaces)]
        mine.append(totals.c.workspace_id.in_(ids) if ids else false())
    if by_cluster:
        mine.append(totals.c.cluster_id == bindparam("cluster", type_=BigInteger))
    start = bindparam("start", type_=_TIME)
    final = bindparam("final", type_=_TIME)
    ends = union_all(
        select(totals).where(totals.c.hour == final, *mine),
        select(totals).where(totals.c.last, totals.c.hour >= start, totals.c.hour < final, *mine),
    ).subquery("ends")
    since = totals.alias("since")
    # literals, not parameters: the statement is compiled once for every report
    zero: Any = literal_column("0.0")
    nothing: Any = literal_column(repr(NOTHING))
    parts = [ends.c[c] - func.coalesce(since.c[c], zero) for c in TOTAL_COLUMNS]
    held_total = functools.reduce(operator.add, parts[: len(CATEGORIES)])
    name = func.coalesce(Run.name, func.cast(ends.c.run_id, String))
    before = bindparam("before", type_=_TIME)
    return (
        select(ends.c.run_id, name, *parts)
        .outerjoin(since, and_(since.c.run_id == ends.c.run_id, since.c.hour == before))
        .outerjoin(Run, Run.id == ends.c.run_id)  # a run deleted since: its id
        .where(or_(*(func.abs(part) > nothing for part in parts)))
        .order_by(held_total.desc(), name)  # as the seed: most held first
    )


@functools.lru_cache(maxsize=64)
def _run_ledgers_sql(workspaces: int | None, by_cluster: bool) -> str:
    """That statement as psycopg takes it (PostgreSQL)."""
    return str(_run_ledgers_statement(workspaces, by_cluster).compile(dialect=_PSYCOPG))


_PSYCOPG = PGDialect_psycopg()
_NAMED: dict[str, Any] = {"run": Run, "machine": Machine, "pool": Pool, "workspace": Workspace}


DAY = timedelta(days=1)
HOURS_A_DAY = 24

# A span of the ledgers read for a period: the daily or the hourly cells of [since, until),
# added (+1) or taken away (-1).
Span = tuple[str, datetime, datetime, int]


def spans(start: datetime, end: datetime) -> list[Span]:
    """The fewest cells that sum to the whole hours [start, end): whole days from the daily
    cells; a day the period covers in part, either its hours in the period, or the whole day
    less its hours outside, whichever reads fewer cells."""
    out: list[Span] = []
    first_day = start.replace(hour=0)
    last_day = (end - timedelta(hours=1)).replace(hour=0)
    if first_day == last_day:
        return _part_of_day(first_day, start, end)
    whole_from = first_day if start == first_day else first_day + DAY
    whole_to = last_day + DAY if end == last_day + DAY else last_day
    if whole_from != first_day:
        out += _part_of_day(first_day, start, first_day + DAY)
    if whole_from < whole_to:
        out.append(("day", whole_from, whole_to, 1))
    if whole_to != last_day + DAY:
        out += _part_of_day(last_day, last_day, end)
    return out


def _part_of_day(day: datetime, start: datetime, end: datetime) -> list[Span]:
    inside = int((end - start) / timedelta(hours=1))
    if inside == HOURS_A_DAY:
        return [("day", day, day + DAY, 1)]
    if inside <= HOURS_A_DAY - inside + 1:
        return [("hour", start, end, 1)]
    outside: list[Span] = [("day", day, day + DAY, 1)]
    if start > day:
        outside.append(("hour", day, start, -1))
    if end < day + DAY:
        outside.append(("hour", end, day + DAY, -1))
    return outside


# A sum below this (GPU-seconds) is what a day less its hours leaves of nothing: rounding.
NOTHING = 1e-6


def _sums(
    scope: str,
    start: datetime,
    end: datetime,
    workspace_ids: Sequence[int] | None,
    cluster_id: int | None,
    scope_ids: Sequence[int] | None,
) -> Any:
    """(scope id, category, held, GPU-seconds) over the hours [start, end): the spans' cells,
    summed; the remains of a day less its hours (rounding, nothing) left out."""
    parts = []
    for unit, since, until, sign in spans(start, end):
        model: Any = GoodputDay if unit == "day" else GoodputHour
        column = model.day if unit == "day" else model.hour
        seconds = model.gpu_seconds if sign > 0 else -model.gpu_seconds
        part = select(
            model.scope_id.label("scope_id"),
            model.category.label("category"),
            model.held.label("held"),
            seconds.label("gpu_seconds"),
        ).where(model.scope == scope, column >= since, column < until)
        if workspace_ids is not None:
            part = part.where(model.workspace_id.in_(workspace_ids))
        if cluster_id is not None:
            part = part.where(model.cluster_id == cluster_id)
        if scope_ids is not None:
            part = part.where(model.scope_id.in_(scope_ids))
        parts.append(part)
    cells = (union_all(*parts) if len(parts) > 1 else parts[0]).subquery()
    keys = [cells.c.scope_id, cells.c.category, cells.c.held]
    total = func.sum(cells.c.gpu_seconds)
    summed = select(*keys, total.label("gpu_seconds")).group_by(*keys)
    if len(parts) > 1 and any(sign < 0 for *_, sign in spans(start, end)):
        summed = summed.having(func.abs(total) > NOTHING)
    return summed


async def scope_names(session: AsyncSession, scope: str, ids: Sequence[int]) -> dict[int, str]:
    models: dict[str, Any] = {"run": Run, "machine": Machine, "pool": Pool, "workspace": Workspace}
    model = models[scope]
    names: dict[int, str] = {}
    dialect = _dialect(session)
    for chunk in _batches(ids, dialect):
        rows = await session.execute(
            select(model.id, model.name).where(_in(model.id, chunk, dialect))
        )
        names.update({r[0]: r[1] for r in rows})
    return names


@dataclass(frozen=True)
class IntervalRow:
    """A worker interval as the ledgers' explanation lists it (closed, or open to the mark)."""

    worker_id: int
    worker_name: str
    run_id: int
    workspace_id: int
    cluster_id: int
    machine_id: int | None
    pool_id: int | None
    start_at: datetime
    end_at: datetime
    category: str
    held: bool
    gpus: int


_INTERVAL_COLUMNS = [f.name for f in IntervalRow.__dataclass_fields__.values()]


async def intervals_of(
    session: AsyncSession,
    *,
    start: datetime,
    end: datetime,
    workspace_ids: Sequence[int] | None,
    cluster_id: int | None = None,
    run_id: int | None = None,
    machine_id: int | None = None,
    pool_id: int | None = None,
    category: str | None = None,
    worker_id: int | None = None,
    limit: int = 1000,
) -> list[IntervalRow]:
    """The worker intervals behind a ledger figure, earliest first: the closed ones and the
    open ones, which end at the tick's mark."""
    mark = await session.scalar(
        select(AccountingMark.counted_until).where(AccountingMark.id == MARK_ID)
    )
    closed = select(*(getattr(GoodputInterval, c) for c in _INTERVAL_COLUMNS))
    parts: list[tuple[Any, Any]] = [(GoodputInterval, closed.where(GoodputInterval.end_at > start))]
    if mark is not None and mark > start:
        open_end = bindparam("open_end", mark, type_=GoodputInterval.end_at.type)
        opened = select(
            *(
                open_end.label(c) if c == "end_at" else getattr(GoodputOpenInterval, c)
                for c in _INTERVAL_COLUMNS
            )
        )
        parts.append((GoodputOpenInterval, opened))
    queries = []
    for model, query in parts:
        query = query.where(model.start_at < end)
        for column, value in (
            ("cluster_id", cluster_id),
            ("run_id", run_id),
            ("machine_id", machine_id),
            ("pool_id", pool_id),
            ("category", category),
            ("worker_id", worker_id),
        ):
            if value is not None:
                query = query.where(getattr(model, column) == value)
        if workspace_ids is not None:
            query = query.where(model.workspace_id.in_(workspace_ids))
        queries.append(query)
    both = union_all(*queries).subquery() if len(queries) > 1 else queries[0].subquery()
    rows = await session.execute(
        select(both).order_by(both.c.start_at, both.c.worker_id).limit(limit)
    )
    return [IntervalRow(*r) for r in rows]


async def workspaces(
    session: AsyncSession, organization_id: int, ids: Sequence[int] | None
) -> dict[int, str]:
    query = select(Workspace.id, Workspace.name).where(Workspace.organization_id == organization_id)
    if ids is not None:
        query = query.where(Workspace.id.in_(ids))
    return {r.id: r.name for r in await session.execute(query)}


async def cluster_sums(
    session: AsyncSession, start: datetime, end: datetime, workspace_ids: Sequence[int]
) -> list[tuple[int, str, bool, float]]:
    """(cluster id, category, held, GPU-seconds): the workspaces' time by cluster."""
    rows = await session.execute(
        select(
            GoodputHour.cluster_id,
            GoodputHour.category,
            GoodputHour.held,
            func.sum(GoodputHour.gpu_seconds),
        )
        .where(
            GoodputHour.scope == "workspace",
            GoodputHour.hour >= start,
            GoodputHour.hour < end,
            GoodputHour.workspace_id.in_(workspace_ids),
        )
        .group_by(GoodputHour.cluster_id, GoodputHour.category, GoodputHour.held)
    )
    return [(r[0], r[1], bool(r[2]), float(r[3])) for r in rows]


async def cluster_names(session: AsyncSession, ids: Sequence[int]) -> dict[int, str]:
    rows = await session.execute(select(Cluster.id, Cluster.name).where(Cluster.id.in_(ids)))
    return {r.id: r.name for r in rows}


async def live_runs(session: AsyncSession, workspace_ids: Sequence[int]) -> list[Run]:
    """Runs still going (not ended, not deleted) of the workspaces."""
    return list(
        await session.scalars(
            select(Run).where(
                Run.workspace_id.in_(workspace_ids),
                Run.state.not_in(ENDED_RUN_STATES),
                Run.deleted_at.is_(None),
            )
        )
    )


async def stalled_workers(session: AsyncSession, workspace_ids: Sequence[int]) -> dict[int, int]:
    """Workers stalled now, by workspace."""
    rows = await session.execute(
        select(Run.workspace_id, func.count())
        .join(Worker, Worker.run_id == Run.id)
        .where(
            Run.workspace_id.in_(workspace_ids),
            Worker.state == "Running",
            Worker.stalled_since.is_not(None),
        )
        .group_by(Run.workspace_id)
    )
    return {r[0]: int(r[1]) for r in rows}


async def runs_with_straggler(
    session: AsyncSession, workspace_ids: Sequence[int], slow_before: datetime
) -> dict[int, int]:
    """Runs with a worker slow since ``slow_before`` or earlier (a straggler now), by workspace."""
    rows = await session.execute(
        select(Run.workspace_id, func.count(func.distinct(Run.id)))
        .join(Worker, Worker.run_id == Run.id)
        .where(
            Run.workspace_id.in_(workspace_ids),
            Worker.state == "Running",
            Worker.slow_since.is_not(None),
            Worker.slow_since <= slow_before,
        )
        .group_by(Run.workspace_id)
    )
    return {r[0]: int(r[1]) for r in rows}


async def scope_id(
    session: AsyncSession,
    scope: str,
    name: str,
    organization_id: int,
    workspace_ids: Sequence[int] | None = None,
) -> int | None:
    """The id of the run, machine, pool or workspace of that name in the organisation (a run:
    the newest of that name in the workspaces given)."""
    if scope == "workspace":
        query = select(Workspace.id).where(
            Workspace.organization_id == organization_id, Workspace.name == name
        )
    elif scope == "run":
        query = (
            select(Run.id)
            .join(Workspace, Workspace.id == Run.workspace_id)
            .where(Workspace.organization_id == organization_id, Run.name == name)
            .order_by(Run.id.desc())
        )
        if workspace_ids is not None:
            query = query.where(Run.workspace_id.in_(workspace_ids))
    else:
        model: Any = Machine if scope == "machine" else Pool
        query = (
            select(model.id)
            .join(Cluster, Cluster.id == model.cluster_id)
            .where(Cluster.organization_id == organization_id, model.name == name)
        )
    return await session.scalar(query.limit(1))


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
