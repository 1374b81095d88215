"""All SQL of the metrics domain."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, overload

import psycopg
from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Float,
    Select,
    Table,
    any_,
    bindparam,
    case,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.selectable import Subquery

from backend.db import copy_binary, driver_connection
from backend.metrics.rules import (
    COUNTER_IDS,
    MINUTE_MS,
    ROW_COLUMNS,
    RangeRequest,
    Row,
    ScopedWorker,
    WorkerMachine,
)
from backend.models import Machine, MetricMinute, MetricSample, Run, Worker

# Range queries are built on the tables, not the mapped classes: they return plain rows, and a
# Core statement skips the ORM's compile step.
SAMPLES: Table = MetricSample.__table__  # type: ignore[assignment]
MINUTES: Table = MetricMinute.__table__  # type: ignore[assignment]
WORKERS: Table = Worker.__table__  # type: ignore[assignment]
RUNS: Table = Run.__table__  # type: ignore[assignment]
MACHINES: Table = Machine.__table__  # type: ignore[assignment]
_PG_TYPES = ("int8", "int8", "float8", "int8", "int2", "int2")
# Long enough back to find each series' sample before the range, so a rate has its first
# increase: samples come every few seconds, one-minute summaries every minute.
RATE_LOOKBACK_MS = 5 * MINUTE_MS


def _is_postgresql(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


# -- ingest --------------------------------------------------------------------------------------


async def workers_on_machine(session: AsyncSession, machine_id: int) -> dict[int, int]:
    """The workers placed on the machine now: their attempts, by id."""
    rows = await session.execute(
        select(Worker.id, Worker.attempt).where(Worker.machine_id == machine_id)
    )
    return {row.id: row.attempt for row in rows}


# At most this many machine ids in one IN (...): SQLite's bound parameters are limited.
MACHINES_PER_QUERY = 500


async def workers_on_machines(
    session: AsyncSession, machine_ids: Collection[int]
) -> dict[int, dict[int, int]]:
    """The workers placed on each of these machines now: their attempts by id, by machine."""
    wanted = sorted(machine_ids)
    found: dict[int, dict[int, int]] = {m: {} for m in wanted}
    for i in range(0, len(wanted), MACHINES_PER_QUERY):
        rows = await session.execute(
            select(Worker.machine_id, Worker.id, Worker.attempt).where(
                Worker.machine_id.in_(wanted[i : i + MACHINES_PER_QUERY])
            )
        )
        for machine_id, worker_id, attempt in rows:
            found[int(machine_id or 0)][worker_id] = attempt
    return found


async def insert_samples_by_machine(session: AsyncSession, rows: Sequence[Row]) -> dict[int, int]:
    """Many machines' rows stored as ``insert_samples`` stores one's, in one COPY on
    PostgreSQL (resends skipped the same way): how many were new, by machine."""
    if not rows:
        return {}
    if not _is_postgresql(session):
        machines = sorted({r[3] for r in rows})
        return {m: await insert_samples(session, [r for r in rows if r[3] == m]) for m in machines}
    try:
        async with session.begin_nested():
            await copy_binary(session, SAMPLES.name, ROW_COLUMNS, _PG_TYPES, rows)
        return dict(Counter(r[3] for r in rows))
    except (psycopg.errors.UniqueViolation, psycopg.errors.ForeignKeyViolation):
        return dict(Counter(await _insert_skipping(session, rows, returning=True)))


async def insert_samples(session: AsyncSession, rows: Sequence[Row]) -> int:
    """Store rows, skipping any already stored (an agent resends what was not acknowledged
    before a reconnect). Returns how many were new."""
    if not rows:
        return 0
    if _is_postgresql(session):
        return await _copy_or_skip(session, rows)
    # An executemany has no row count on SQLite; the connection's count of changes does.
    before = await session.scalar(select(func.total_changes()))
    statement = sqlite.insert(MetricSample).on_conflict_do_nothing()
    await session.execute(statement, [dict(zip(ROW_COLUMNS, r, strict=True)) for r in rows])
    return int(await session.scalar(select(func.total_changes())) or 0) - int(before or 0)


async def _copy_or_skip(session: AsyncSession, rows: Sequence[Row]) -> int:
    """COPY, the fast path, inside a savepoint; a batch holding a sample already stored (or
    one of a worker deleted meanwhile) fails as a whole, and goes again row by row through an
    INSERT that skips what is there. Resends are rare, so nearly every batch is a COPY."""
    try:
        async with session.begin_nested():
            return await copy_binary(session, SAMPLES.name, ROW_COLUMNS, _PG_TYPES, rows)
    except (psycopg.errors.UniqueViolation, psycopg.errors.ForeignKeyViolation):
        return await _insert_skipping(session, rows)


@overload
async def _insert_skipping(
    session: AsyncSession, rows: Sequence[Row], returning: Literal[False] = False
) -> int: ...


@overload
async def _insert_skipping(
    session: AsyncSession, rows: Sequence[Row], returning: Literal[True]
) -> list[int]: ...


async def _insert_skipping(
    session: AsyncSession, rows: Sequence[Row], returning: bool = False
) -> int | list[int]:
    """The rows not stored yet (of workers that still exist): how many, or (``returning``)
    the machine id of each one stored."""
    columns = [list(column) for column in zip(*rows, strict=True)]
    typed = ", ".join(f"%s::{t}[]" for t in _PG_TYPES)
    names = ", ".join(ROW_COLUMNS)
    statement = (
        f"INSERT INTO {SAMPLES.name} ({names}) SELECT {names} FROM unnest({typed}) AS u({names}) "
        "WHERE EXISTS (SELECT 1 FROM workers w WHERE w.id = u.worker_id) ON CONFLICT DO NOTHING"
    )
    if returning:
        statement += " RETURNING machine_id"
    pg = await driver_connection(session)
    async with pg.cursor() as cursor:
        await cursor.execute(statement, columns)
        if returning:
            return [int(row[0]) for row in await cursor.fetchall()]
        return cursor.rowcount


# -- range queries -------------------------------------------------------------------------------


async def workers_of(
    session: AsyncSession,
    workspace_id: int,
    *,
    runs: Sequence[str],
    workers: Sequence[str],
    ended_since: int,
) -> list[ScopedWorker]:
    """The workers of the workspace's live runs that a range query may read: those of the runs
    or workers it names (all of them, to tell which names exist), or else of every run that
    had not ended before ``ended_since`` (epoch ms)."""
    query = (
        select(WORKERS.c.id, WORKERS.c.name, RUNS.c.name, RUNS.c.ended_at)
        .join(RUNS, RUNS.c.id == WORKERS.c.run_id)
        .where(RUNS.c.workspace_id == workspace_id, RUNS.c.deleted_at.is_(None))
    )
    if runs or workers:
        query = query.where(or_(RUNS.c.name.in_(runs), WORKERS.c.name.in_(workers)))
    else:
        since = datetime.fromtimestamp(ended_since / 1000, UTC)
        query = query.where(or_(RUNS.c.ended_at.is_(None), RUNS.c.ended_at >= since))
    rows = await session.execute(query)
    return [
        ScopedWorker(id, name, run, _ms(ended) if ended else None) for id, name, run, ended in rows
    ]


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


async def buckets(
    session: AsyncSession, worker_ids: Sequence[int], request: RangeRequest, *, with_minutes: bool
) -> list[tuple[tuple[str, ...], int, float]]:
    """(labels kept, step start, value) for each series and step, oldest first per series.

    Two GROUP BYs in one statement: each worker's (and GPU's) samples in a step become one
    value, then the series that share the labels kept are combined with ``agg``."""
    needs_machine = any(g.label == "machine" for g in request.by) or "machine" in request.matches
    lower = request.start_ms
    if request.rate:
        lower -= max(request.step_ms, RATE_LOOKBACK_MS)
    tables = [SAMPLES, MINUTES] if with_minutes else [SAMPLES]
    ids = _one_of(worker_ids, _is_postgresql(session))
    parts = [_source(t, ids, request, lower, needs_machine) for t in tables]
    source = (parts[0] if len(parts) == 1 else union_all(*parts)).subquery("s")
    per_series = _per_series(source, request, needs_machine).subquery("series")
    rows = await session.execute(_combined(per_series, request))
    width = len(request.by)
    return [
        (tuple(_text(v) for v in row[:width]), int(row[width]), float(row[width + 1]))
        for row in rows
    ]


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _one_of(worker_ids: Sequence[int], postgresql: bool) -> Callable[[Table], ColumnElement[bool]]:
    """``worker_id`` among the ids: one array parameter on PostgreSQL, however many workers."""
    if postgresql:
        ids = bindparam("worker_ids", list(worker_ids), type_=ARRAY(BigInteger))
        return lambda table: table.c.worker_id == any_(ids)
    return lambda table: table.c.worker_id.in_(list(worker_ids))


def _source(
    table: Table,
    of_workers: Callable[[Table], ColumnElement[bool]],
    request: RangeRequest,
    lower_ms: int,
    needs_machine: bool,
) -> Select[Any]:
    """The workers' samples of the metric in the range: an index-only scan per series, in key
    order, so a rate's window needs no sort."""
    columns = [table.c.worker_id, table.c.gpu, table.c.ts, table.c.value]
    if needs_machine:
        columns.append(table.c.machine_id)
    query = select(*columns).where(
        of_workers(table),
        table.c.metric == request.metric.id,
        table.c.gpu.in_(request.gpus),
        table.c.ts >= lower_ms,
        table.c.ts <= request.end_ms,
    )
    if machines := request.matches.get("machine"):
        query = query.where(
            table.c.machine_id.in_(select(MACHINES.c.id).where(MACHINES.c.name.in_(machines)))
        )
    return query


def _bucket(ts: ColumnElement[int], step_ms: int) -> ColumnElement[int]:
    # The step is written into the SQL, not bound: PostgreSQL must see the GROUP BY expression
    # and the selected one as the same, and two parameters never are. It is a checked integer.
    step = literal_column(str(int(step_ms)), BigInteger)
    return (ts // step) * step


def _per_series(source: Subquery, request: RangeRequest, needs_machine: bool) -> Select[Any]:
    series = [source.c.worker_id, source.c.gpu]
    if needs_machine:
        series.append(source.c.machine_id)
    if request.within_series == "rate":
        return _rates(source, request, series)
    bucket = _bucket(source.c.ts, request.step_ms)
    value = getattr(func, request.within_series)(source.c.value)
    return select(*series, bucket.label("b"), value.label("v")).group_by(*series, bucket)


def _rates(source: Subquery, request: RangeRequest, series: list[Any]) -> Select[Any]:
    """Per-second rate of a counter in each step: its increases over the time they took.

    An increase is measured between consecutive samples of a series; a value below the one
    before means the counter restarted (a new container), and counts from zero."""
    by_series = [source.c.worker_id, source.c.gpu]
    lagged = select(
        *series,
        source.c.ts,
        source.c.value,
        func.lag(source.c.value).over(partition_by=by_series, order_by=source.c.ts).label("pv"),
        func.lag(source.c.ts).over(partition_by=by_series, order_by=source.c.ts).label("pt"),
    ).subquery("lagged")
    kept = [lagged.c[c.name] for c in series]
    increase = case(
        (lagged.c.value >= lagged.c.pv, lagged.c.value - lagged.c.pv), else_=lagged.c.value
    )
    per_second = func.sum(increase) * literal(1000.0, Float) / func.sum(lagged.c.ts - lagged.c.pt)
    bucket = _bucket(lagged.c.ts, request.step_ms)
    return (
        select(*kept, bucket.label("b"), per_second.label("v"))
        .where(lagged.c.pt.is_not(None), lagged.c.ts >= request.start_ms)
        .group_by(*kept, bucket)
    )


def _combined(per_series: Subquery, request: RangeRequest) -> Select[Any]:
    joined: Any = per_series
    wants = {g.label for g in request.by}
    if wants & {"run", "worker"}:
        joined = joined.join(WORKERS, WORKERS.c.id == per_series.c.worker_id)
    if "run" in wants:
        joined = joined.join(RUNS, RUNS.c.id == WORKERS.c.run_id)
    if "machine" in wants:
        joined = joined.outerjoin(MACHINES, MACHINES.c.id == per_series.c.machine_id)
    column: dict[str, Any] = {
        "run": RUNS.c.name,
        "worker": WORKERS.c.name,
        "machine": MACHINES.c.name,
        "gpu": per_series.c.gpu,
    }
    labels = [column[g.label] for g in request.by]
    value = getattr(func, request.agg)(per_series.c.v)
    return (
        select(*labels, per_series.c.b, value)
        .select_from(joined)
        .group_by(*labels, per_series.c.b)
        .order_by(*labels, per_series.c.b)
    )


# -- pruning -------------------------------------------------------------------------------------


async def roll_up(session: AsyncSession, before_ms: int) -> int:
    """Summarise raw samples older than ``before_ms`` into one-minute rows (a gauge's mean, a
    counter's last value). A minute already summarised is left as it is, so a rerun is
    harmless."""
    minute = _bucket(SAMPLES.c.ts, MINUTE_MS)
    value = case(
        (SAMPLES.c.metric.in_(COUNTER_IDS), func.max(SAMPLES.c.value)),
        else_=func.avg(SAMPLES.c.value),
    )
    summary = (
        select(
            SAMPLES.c.worker_id,
            minute.label("ts"),
            value.label("value"),
            func.max(SAMPLES.c.machine_id).label("machine_id"),
            SAMPLES.c.metric,
            SAMPLES.c.gpu,
        )
        .where(SAMPLES.c.ts < before_ms)
        .group_by(SAMPLES.c.worker_id, SAMPLES.c.metric, SAMPLES.c.gpu, minute)
    )
    dialect = postgresql if _is_postgresql(session) else sqlite
    statement = dialect.insert(MINUTES).from_select(list(ROW_COLUMNS), summary)
    statement = statement.on_conflict_do_nothing().execution_options(preserve_rowcount=True)
    result = await session.execute(statement)
    return int(getattr(result, "rowcount", 0))


async def delete_samples(session: AsyncSession, before_ms: int) -> int:
    result = await session.execute(delete(SAMPLES).where(SAMPLES.c.ts < before_ms))
    return int(getattr(result, "rowcount", 0) or 0)


async def delete_minutes(session: AsyncSession, before_ms: int) -> int:
    result = await session.execute(delete(MINUTES).where(MINUTES.c.ts < before_ms))
    return int(getattr(result, "rowcount", 0) or 0)


async def latest(
    session: AsyncSession, worker_ids: Sequence[int], since_ms: int
) -> list[tuple[int, int, int, float]]:
    """(worker, metric id, gpu, value): each worker's newest sample of each metric and GPU
    since ``since_ms``, read along the primary key (worker, metric, gpu, ts)."""
    if not worker_ids:
        return []
    newest = (
        select(
            MetricSample.worker_id,
            MetricSample.metric,
            MetricSample.gpu,
            func.max(MetricSample.ts).label("ts"),
        )
        .where(MetricSample.worker_id.in_(worker_ids), MetricSample.ts >= since_ms)
        .group_by(MetricSample.worker_id, MetricSample.metric, MetricSample.gpu)
        .subquery()
    )
    rows = await session.execute(
        select(
            MetricSample.worker_id, MetricSample.metric, MetricSample.gpu, MetricSample.value
        ).join(
            newest,
            (MetricSample.worker_id == newest.c.worker_id)
            & (MetricSample.metric == newest.c.metric)
            & (MetricSample.gpu == newest.c.gpu)
            & (MetricSample.ts == newest.c.ts),
        )
    )
    return [(r[0], r[1], r[2], float(r[3])) for r in rows]


async def machines_of(session: AsyncSession, worker_ids: Sequence[int]) -> list[WorkerMachine]:
    """The placed workers among these, with what their machine's agent cannot measure."""
    rows = await session.execute(
        select(WORKERS.c.name, MACHINES.c.executor, MACHINES.c.unmeasured_metrics)
        .join(MACHINES, MACHINES.c.id == WORKERS.c.machine_id)
        .where(WORKERS.c.id.in_(worker_ids))
    )
    return [
        WorkerMachine(name, executor, tuple(unmeasured or ()))
        for name, executor, unmeasured in rows
    ]
