"""All SQL of goodput accounting's ledgers' writes: the minute of the workers without a change
in one statement (PostgreSQL), GPU-seconds added to (or taken back from) the hourly and daily
cells, the runs' running totals kept in line with them, pruning. The tick's mark, the history it
counts and the workers' intervals are in backend/accounting/repository.py; the reports' reads
in ledger_queries.py (the cells summed), interval_queries.py, prometheus_queries.py and
series_queries.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, func, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting.repository import _TIME, UTILIZATION, _chunks, _dialect
from backend.accounting.rules import CATEGORIES, HOUR, WINDING_DOWN
from backend.db.engine import driver_connection
from backend.models import GoodputDay, GoodputHour, GoodputInterval, GoodputRunTotal, Redo
from backend.models.goodput import TOTAL_COLUMNS


def _add_cells(table: str, time: str) -> str:
    """Add the ``cells`` of the statement to a ledger (hourly or daily) at ``%(time)s``."""
    key = "workspace_id, cluster_id, scope, scope_id, category, held"
    return (
        f"INSERT INTO {table} ({time}, {key}, gpu_seconds) "
        f"SELECT %({time})s, {key}, gpu_seconds FROM cells "
        f"ON CONFLICT ({time}, {key}) "
        f"DO UPDATE SET gpu_seconds = {table}.gpu_seconds + excluded.gpu_seconds"
    )


# A run's cells of an hour as the columns of its running totals (GROUP BY the run and hour).
RUN_CELL_SUMS = ", ".join(
    f"sum(CASE WHEN category = '{category.value}' AND {held} THEN gpu_seconds ELSE 0 END) "
    f"AS {category.value}_{part}"
    for part, held in (("held", "held"), ("not_held", "NOT held"))
    for category in CATEGORIES
)


def _columns(template: str) -> str:
    return ", ".join(template.format(c=c) for c in TOTAL_COLUMNS)


# The minute of every worker without a change, in one statement (PostgreSQL): its category by
# its phase (running: by the minute's mean utilisation), its open interval carried on or
# closed and a new one opened, its cells added to the hourly and daily ledgers, and its run's
# running totals moved on by the minute (``run_*``): added to the run's rows from the hour on
# (its last row, since the tick counts in order), or a row for the hour made from its last row
# (each hour between repeating it, as refresh_run_totals does) that then is last. Added, not
# recomputed from the hour's cells: one statement sees only the hourly cells as they were
# before it, and at a million workers reading them back took 6 of the tick's 18 s.
# A worker winding down, or deleted without its time counted (an orphan), is not steady: it is
# left as it is and named in the answer, for the tick to count from its history or close. The
# same scan finds them that counts the others (two more scans of the open intervals took 0.5
# to 1 s a tick at a million workers).
_STEADY_MINUTE_SQL = """
WITH busy AS (
  SELECT worker_id, avg(value) AS mean FROM metric_samples
  WHERE metric = %(metric)s AND ts >= %(start_ms)s AND ts < %(end_ms)s
  GROUP BY worker_id
), open AS (
  SELECT o.worker_id, o.worker_name, o.run_id, o.workspace_id, o.cluster_id, o.gpus, o.held,
    o.machine_id, o.start_at, o.category AS was_category, o.pool_id AS was_pool,
    CASE WHEN o.phase <> 'running' THEN o.category
      WHEN b.mean >= %(busy)s THEN 'productive' ELSE 'idle' END AS category,
    m.pool_id, w.id IS NULL AS gone, o.phase = ANY(%(winding)s::text[]) AS winding
  FROM goodput_open_intervals o
  LEFT JOIN workers w ON w.id = o.worker_id
  LEFT JOIN machines m ON m.id = o.machine_id
  LEFT JOIN busy b ON b.worker_id = o.worker_id
  WHERE o.worker_id <> ALL(%(changed)s::bigint[]) OR w.id IS NULL
), moved AS (
  SELECT * FROM open
  WHERE NOT (gone OR winding)
    AND (NOT %(same_hour)s OR category <> was_category OR pool_id IS DISTINCT FROM was_pool)
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
  FROM open c CROSS JOIN LATERAL (VALUES ('run', c.run_id), ('workspace', c.workspace_id),
    ('machine', c.machine_id), ('pool', c.pool_id)) AS x(scope, scope_id)
  WHERE NOT (c.gone OR c.winding) AND x.scope_id IS NOT NULL
  GROUP BY 1, 2, 3, 4, 5, 6
), hours AS ({hours}), days AS ({days}),
run_cells AS (
  SELECT scope_id AS run_id, workspace_id, cluster_id, {sums}
  FROM cells WHERE scope = 'run' GROUP BY scope_id, workspace_id, cluster_id
), run_lasts AS (
  SELECT r.*, t.hour AS last_hour, {was}
  FROM run_cells r LEFT JOIN goodput_run_totals t ON t.run_id = r.run_id AND t.last
), run_added AS (
  UPDATE goodput_run_totals t SET {added}
  FROM run_lasts r WHERE t.run_id = r.run_id AND r.last_hour >= %(hour)s AND t.hour >= %(hour)s
), run_superseded AS (
  UPDATE goodput_run_totals t SET last = false
  FROM run_lasts r WHERE t.run_id = r.run_id AND t.hour = r.last_hour AND r.last_hour < %(hour)s
), run_extended AS (
  INSERT INTO goodput_run_totals (run_id, hour, workspace_id, cluster_id, last, {totals})
  SELECT r.run_id, h.hour, r.workspace_id, r.cluster_id, h.hour = %(hour)s, {extended}
  FROM run_lasts r CROSS JOIN LATERAL generate_series(
    coalesce(r.last_hour + interval '1 hour', %(hour)s), %(hour)s, interval '1 hour') AS h(hour)
  WHERE r.last_hour IS NULL OR r.last_hour < %(hour)s
)
SELECT count(*) FILTER (WHERE NOT (gone OR winding)), (SELECT count(*) FROM closed),
  coalesce(array_agg(worker_id) FILTER (WHERE winding AND NOT gone), '{{}}'),
  count(*) FILTER (WHERE gone)
FROM open
"""
_STEADY_MINUTE = _STEADY_MINUTE_SQL.format(
    hours=_add_cells("goodput_hours", "hour"),
    days=_add_cells("goodput_days", "day"),
    sums=RUN_CELL_SUMS,
    was=_columns("t.{c} AS was_{c}"),
    added=_columns("{c} = t.{c} + r.{c}"),
    totals=_columns("{c}"),
    extended=_columns("coalesce(r.was_{c}, 0) + CASE WHEN h.hour = %(hour)s THEN r.{c} ELSE 0 END"),
)


@dataclass(frozen=True)
class SteadyMinute:
    """What a steady minute counted: its workers and the intervals it closed; and those it left
    for the tick: workers winding down (counted from their history) and how many open intervals
    have lost their worker (orphans, closed at the mark)."""

    workers: int
    closed: int
    winding_down: list[int]
    orphans: int


async def count_steady_minute(
    session: AsyncSession, minute: datetime, changed: Sequence[int], busy: float
) -> SteadyMinute:
    """Count the minute from ``minute`` of every worker with an open interval but those
    ``changed``, those winding down and orphans (PostgreSQL)."""
    end = minute + timedelta(minutes=1)
    pg = await driver_connection(session)
    # For the tick's transaction only: no JIT (compiling this statement took 1.1 to 1.6 s at a
    # million workers, more than it saved), and 32 MB for each hash (the default 8 MB made the
    # minute's cells spill 63 MB to disk at a million workers; 0.75 s of its 11). At 48 MB and
    # more the planner hashes the samples by worker too, which took 2 s more than their index.
    await pg.execute(
        "SELECT set_config('jit', 'off', true), set_config('hash_mem_multiplier', '8', true)"
    )
    cursor = await pg.execute(
        _STEADY_MINUTE,
        {
            "metric": UTILIZATION,
            "start_ms": int(minute.timestamp() * 1000),
            "end_ms": int(end.timestamp() * 1000),
            "busy": busy,
            "changed": list(changed),
            "winding": sorted(str(phase) for phase in WINDING_DOWN),
            "same_hour": minute.minute != 0,
            "start": minute,
            "seconds": 60.0,
            "hour": minute.replace(minute=0),
            "day": minute.replace(hour=0, minute=0),
        },
    )
    row = await cursor.fetchone()
    assert row is not None
    workers, closed, winding, orphans = row
    return SteadyMinute(int(workers), int(closed), list(winding), int(orphans))


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
    took_back = any(seconds < 0 for seconds in cells.values())
    if took_back:
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
    if took_back:
        await trim_run_totals(session, touched)


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


_RUN_ROWS = f"""
WITH keys AS ({{keys}})
SELECT run_id, hour, {", ".join(TOTAL_COLUMNS)} FROM goodput_run_totals
WHERE run_id IN (SELECT run_id FROM keys) AND hour >= :since
ORDER BY run_id, hour
"""
_LAST_OF = """
WITH keys AS ({keys})
UPDATE goodput_run_totals SET last = true
WHERE run_id IN (SELECT run_id FROM keys) AND hour = (
  SELECT max(t.hour) FROM goodput_run_totals t WHERE t.run_id = goodput_run_totals.run_id)
"""


async def trim_run_totals(session: AsyncSession, touched: dict[int, RunTouch]) -> None:
    """After time was taken back, drop the ``touched`` runs' rows for hours left without cells
    at either end of their history, and mark the latest row that stays last.

    refresh_run_totals recomputes every hour it touched, but an hour whose cells a take-back
    emptied (a transition recorded late ended the worker before a tick had counted past it)
    kept its row, a repeat of the hour before, still marked last: a row for an hour in which
    nothing was counted (issue 36). Cells are never negative, so a run's rows only grow: a
    row equal to the one before is an hour without cells, and a row of zeros comes before any
    cell. Only rows from the first hour that changed are looked at: older ones hold hours
    whose cells were pruned, and no take-back reaches them."""
    dialect = _dialect(session)
    since = min(touch.first for touch in touched.values()) - HOUR
    rows: dict[int, list[Any]] = {}
    for runs in _chunks(sorted(touched)):
        found = await session.execute(
            text(_RUN_ROWS.format(keys=_KEYS[dialect]))
            .bindparams(bindparam("since", type_=_TIME))
            .columns(hour=_TIME),
            {**_keys(dialect, [(run, 0, 0, False) for run in runs]), "since": since},
        )
        for row in found:
            rows.setdefault(row[0], []).append(row)
    doomed: list[tuple[int, datetime]] = []
    for run, mine in rows.items():
        doomed += [(run, r.hour) for r in _without_cells(mine, touched[run].first)]
    if not doomed:
        return
    totals = GoodputRunTotal.__table__
    for run, hour in doomed:
        await session.execute(delete(totals).where(totals.c.run_id == run, totals.c.hour == hour))
    runs = sorted({run for run, _ in doomed})
    for chunk in _chunks(runs):
        await session.execute(
            text(_LAST_OF.format(keys=_KEYS[dialect])),
            _keys(dialect, [(run, 0, 0, False) for run in chunk]),
        )


def _without_cells(rows: Sequence[Any], first: datetime) -> list[Any]:
    """Of one run's running totals from the hour before ``first`` on, in order: those from
    ``first`` on whose hour has no cells and that no hour with cells follows (a repeat of the
    row before at the end), or that no hour with cells precedes (zeros)."""

    def same(a: Sequence[float], b: Sequence[float]) -> bool:
        return all(abs(x - y) <= 1e-6 * max(1.0, abs(x)) for x, y in zip(a, b, strict=True))

    zeros = [0.0] * len(TOTAL_COLUMNS)
    sums = [tuple(r[2:]) for r in rows]
    out = []
    end = len(rows)
    while end > 0 and rows[end - 1].hour >= first:
        before = sums[end - 2] if end > 1 else zeros
        if not same(sums[end - 1], before):
            break
        end -= 1
        out.append(rows[end])
    out += [r for r, s in zip(rows[:end], sums, strict=False) if r.hour >= first and same(s, zeros)]
    return out


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


async def prune(session: AsyncSession, before: datetime) -> tuple[int, int]:
    """Delete ledger hours (and whole days), intervals and ended redos older than ``before``;
    how many hours and intervals. The runs' running totals keep the hour before ``before``: a period
    from there on is the difference of two rows."""
    hours = await session.execute(delete(GoodputHour).where(GoodputHour.hour < before))
    totals = GoodputRunTotal.__table__
    await session.execute(delete(totals).where(totals.c.hour < before - HOUR))
    await session.execute(delete(GoodputDay).where(GoodputDay.day < before.replace(hour=0)))
    intervals = await session.execute(
        delete(GoodputInterval).where(GoodputInterval.end_at <= before)
    )
    # a restart's redo goes with the intervals its rework was measured on
    await session.execute(delete(Redo).where(Redo.until <= before))
    return int(hours.rowcount), int(intervals.rowcount)  # type: ignore[attr-defined]
