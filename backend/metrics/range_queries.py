"""The SQL of a metrics range query: one statement per shape (the scope's workers, their
samples' steps, the series combined by the labels kept), built and compiled once, its values
bound; and its rows read back into series. Ingest and pruning are in repository.py."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Dialect,
    Float,
    Select,
    SmallInteger,
    Table,
    and_,
    any_,
    bindparam,
    case,
    cast,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.selectable import CompoundSelect, Subquery

from backend.db.engine import driver_connection
from backend.metrics.repository import (
    HISTORY,
    MACHINES,
    MINUTES,
    RUNS,
    SAMPLES,
    WORKERS,
    WORKSPACES,
    is_postgresql,
    step_start,
)
from backend.metrics.rules import (
    ENDED_SLACK_MS,
    MINUTE_MS,
    RangeRequest,
    ScopedWorker,
    WorkerMachine,
)

# Long enough back to find each series' sample before the range, so a rate has its first
# increase: samples come every few seconds, one-minute summaries every minute.
RATE_LOOKBACK_MS = 5 * MINUTE_MS


@dataclass(frozen=True)
class RangeRows:
    """What a range query read, in one statement: the workspace, as (id, organisation), None
    where there is none; the workers it may read (``ScopedWorker``); and its series, by the
    labels kept: (step start, value) for each step, oldest first."""

    workspace: tuple[int, int] | None
    scoped: list[ScopedWorker]
    series: dict[tuple[str, ...], list[tuple[int, float]]]


async def range_rows(
    session: AsyncSession,
    request: RangeRequest,
    workspace: int | tuple[int, str],
    *,
    with_minutes: bool,
) -> RangeRows:
    """A range query's rows, in one statement, built once per shape with its values bound (a
    query pays for running it, not for building it again).

    The scope: the workspace, by id or by (organisation, name), and the workers of its live
    runs the query may read, each with its machine (where it is placed, or where it last ran):
    those of the runs or workers ``match`` names (all of them, to tell which names exist), or
    else of every run that had not ended before the range (less ``ENDED_SLACK_MS``). The
    workspace's row comes even without a worker. ``in_scope`` marks the workers whose samples
    are read: the names' labels all apply, and the run had not ended before the range.

    The buckets: two GROUP BYs: each worker's (and GPU's) samples in a step become one value,
    then the series that share the labels kept are combined with ``agg``."""
    runs = request.matches.get("run", ())
    workers = request.matches.get("worker", ())
    machines = request.matches.get("machine", ())
    shape = _Shape(
        postgresql=is_postgresql(session),
        by_id=isinstance(workspace, int),
        runs=len(runs),
        workers=len(workers),
        machines=len(machines),
        with_minutes=with_minutes,
        needs_machine=any(g.label == "machine" for g in request.by) or bool(machines),
        within_series=request.within_series,
        agg=request.agg,
        by=tuple(g.label for g in request.by),
        step_ms=request.step_ms,
        gpus=request.gpus,
    )
    lower = request.start_ms
    if request.rate:
        lower -= max(request.step_ms, RATE_LOOKBACK_MS)
    values: dict[str, Any] = {
        "since": datetime.fromtimestamp((request.start_ms - ENDED_SLACK_MS) / 1000, UTC),
        "metric": request.metric.id,
        "lower": lower,
        "start": request.start_ms,
        "end": request.end_ms,
    }
    if isinstance(workspace, int):
        values["workspace"] = workspace
    else:
        values["organization"], values["name"] = workspace
    for key, names in (("runs", runs), ("workers", workers), ("machines", machines)):
        values.update((f"{key}_{i}", name) for i, name in enumerate(names))
    return _read(await _run(session, shape, values), len(shape.by), session.get_bind().dialect)


async def _run(session: AsyncSession, shape: _Shape, values: dict[str, Any]) -> Sequence[Any]:
    """The statement's rows. On PostgreSQL through psycopg's own cursor, its text compiled once
    per shape, in binary: SQLAlchemy's execution and the text form of the values cost the last
    hour's query about as much as running it (issue 24)."""
    if not shape.postgresql:
        connection = await session.connection()
        return (await connection.execute(_range_statement(shape), values)).all()
    sql, literals = _range_sql(shape)
    pg = await driver_connection(session)
    async with pg.cursor(binary=True) as cursor:
        await cursor.execute(sql, literals | values, prepare=True)
        return await cursor.fetchall()


_STEP = operator.itemgetter(0)


def _read(rows: Sequence[Any], width: int, dialect: Dialect) -> RangeRows:
    """The statement's rows, the series in their order: each one's steps, oldest first; the
    scope's rows."""
    buckets = [row for row in rows if row[0] == _BUCKET]
    series: dict[tuple[str, ...], list[tuple[int, float]]] = {}
    if width == 0 and buckets:  # no label kept: one series
        series[()] = [row[1:3] for row in buckets]
    for row in buckets if width else ():
        labels = tuple(map(_text, row[1 : 1 + width]))
        series.setdefault(labels, []).append(row[1 + width : 3 + width])
    for points in series.values():
        points.sort(key=_STEP)
    workspace_found: tuple[int, int] | None = None
    scoped: list[ScopedWorker] = []
    for row in [row for row in rows if row[0] == _SCOPE] if len(buckets) < len(rows) else ():
        ws, org, id, name, run, ended, read, machine, executor, unmeasured = row[3 + width :]
        workspace_found = (ws, org)
        if id is None:
            continue
        on = None
        if machine is not None:
            on = WorkerMachine(
                name,
                executor,
                tuple(_loaded(dialect, MACHINES.c.unmeasured_metrics, unmeasured) or ()),
            )
        ended = _loaded(dialect, RUNS.c.ended_at, ended)
        scoped.append(ScopedWorker(id, name, run, _ms(ended) if ended else None, on, bool(read)))
    return RangeRows(workspace_found, scoped, series)


def _loaded(dialect: Dialect, column: Column[Any], value: Any) -> Any:
    """A scope value as its column's type loads it: through SQLAlchemy (SQLite) the statement's
    first rows (the buckets') give its columns their types, so the scope's few values are not
    typed by it (the buckets' hundreds of rows then pay for no loading they do not need);
    psycopg's rows come typed, and are only made UTC here."""
    processor = column.type.dialect_impl(dialect).result_processor(dialect, None)
    return value if processor is None or value is None else processor(value)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class _Shape:
    """What a range query's statement is made of; its values are bound."""

    postgresql: bool
    by_id: bool  # the workspace by id, else by organisation and name
    # How many runs, workers and machines ``match`` names, each bound on its own (see _one_of).
    runs: int
    workers: int
    machines: int
    with_minutes: bool
    needs_machine: bool
    within_series: str
    agg: str
    by: tuple[str, ...]
    step_ms: int  # written into the SQL (see repository.step_start)
    gpus: tuple[int, ...]  # written into the SQL (see _source)


# The statement's rows: the first column says which part a row is of; then a bucket row's
# columns (labels, step, value), then a scope row's (each part's are NULL in the other's rows).
_BUCKET, _SCOPE = 0, 1
_SCOPE_COLUMNS = 10


@functools.lru_cache(maxsize=256)
def _range_sql(shape: _Shape) -> tuple[str, dict[str, Any]]:
    """The statement as psycopg's text, and the values it holds itself (its literals)."""
    compiled = _range_statement(shape).compile(dialect=_PSYCOPG)
    return str(compiled), {k: v for k, v in compiled.params.items() if v is not None}


_PSYCOPG = postgresql.psycopg.dialect()


@functools.lru_cache(maxsize=256)
def _range_statement(shape: _Shape) -> CompoundSelect:
    scope = _scope(shape).cte("scope")
    read = select(scope.c.worker_id).where(scope.c.in_scope)
    tables = [SAMPLES, MINUTES] if shape.with_minutes else [SAMPLES]
    parts = [_source(t, read, shape) for t in tables]
    source = (parts[0] if len(parts) == 1 else union_all(*parts)).subquery("s")
    per_series = _per_series(source, shape).subquery("series")
    width = len(shape.by)
    bucket_rows = _combined(per_series, shape)
    nulls: list[Any] = [null() for _ in range(width + 2)]  # the labels, the step, the value
    scope_rows = select(literal_column(str(_SCOPE)), *nulls, *scope.c)
    labels: list[Any] = [literal_column(f"label_{i}") for i in range(width)]
    # The series in their labels' order (the database's collation), where labels are kept;
    # _read puts each one's steps in order: a sort of the last hour's 240 rows here (each as
    # wide as a scope row) took longer than the whole statement's work beyond the bare one's
    rows = union_all(bucket_rows, scope_rows)
    return rows.order_by(*labels) if labels else rows


def _one_of(column: Column[Any], key: str, count: int) -> ColumnElement[bool]:
    """``column`` holds one of ``count`` values, bound as ``key_0``, ``key_1``…: a statement
    for each count, its text made once. PostgreSQL plans a prepared statement once for all its
    runs (a generic plan) only when that plan costs about what one for the values would; for
    an array parameter it counts ten values, and its plan for one worker's name read the whole
    runs table (issue 24)."""
    return column.in_([bindparam(f"{key}_{i}", type_=column.type) for i in range(count)])


def _scope(shape: _Shape) -> Select[Any]:
    live = and_(RUNS.c.workspace_id == WORKSPACES.c.id, RUNS.c.deleted_at.is_(None))
    named = []
    if shape.runs:
        named.append(_one_of(RUNS.c.name, "runs", shape.runs))
    if shape.workers:
        named.append(_one_of(WORKERS.c.name, "workers", shape.workers))
    not_ended = or_(RUNS.c.ended_at.is_(None), RUNS.c.ended_at >= bindparam("since"))
    live = and_(live, or_(*named) if named else not_ended)
    placed = RUNS.join(WORKERS, WORKERS.c.run_id == RUNS.c.id).outerjoin(
        MACHINES, MACHINES.c.id == func.coalesce(WORKERS.c.machine_id, _last_machine())
    )
    query = select(
        WORKSPACES.c.id.label("ws"),
        WORKSPACES.c.organization_id.label("org"),
        WORKERS.c.id.label("worker_id"),
        WORKERS.c.name.label("worker"),
        RUNS.c.name.label("run"),
        RUNS.c.ended_at,
        and_(*named, not_ended).label("in_scope"),
        MACHINES.c.id.label("machine_id"),
        MACHINES.c.executor,
        MACHINES.c.unmeasured_metrics,
    ).select_from(WORKSPACES.outerjoin(placed, live))
    if shape.by_id:
        return query.where(WORKSPACES.c.id == bindparam("workspace"))
    return query.where(
        WORKSPACES.c.organization_id == bindparam("organization"),
        WORKSPACES.c.name == bindparam("name"),
    )


def _last_machine() -> ColumnElement[Any]:
    """The machine a worker not placed now last held its GPUs on (its history's newest change
    that had one, as lifecycle.repository.last_machine finds it): an ended run's workers hold
    none, and what their machine did not measure is still not measured (issue 36). Read only
    for a worker not placed (COALESCE's second argument), along the worker's history index."""
    return (
        select(HISTORY.c.machine_id)
        .where(HISTORY.c.worker_id == WORKERS.c.id, HISTORY.c.machine_id.is_not(None))
        .order_by(HISTORY.c.id.desc())
        .limit(1)
        .correlate(WORKERS)
        .scalar_subquery()
    )


def _source(table: Table, read: Select[Any], shape: _Shape) -> Select[Any]:
    """The workers' samples of the metric in the range: an index scan per series, in key
    order, so a rate's window needs no sort.

    The GPUs are written into the SQL, checked integers of a few lists (all, one, the worker's
    own -1): PostgreSQL's plan for an array parameter counts ten of them, and for the last
    hour costs that plan over twice the one planned for its values, so it plans the
    statement again at each run (0.5 ms, as long as running it; issue 24)."""
    columns = [table.c.worker_id, table.c.gpu, table.c.ts, table.c.value]
    if shape.needs_machine:
        columns.append(table.c.machine_id)
    if shape.postgresql:
        # An array of the ids, found first (an InitPlan): the index is then read series by
        # series in its order, where a join from the scope would need a sort for a rate's window.
        of_workers = table.c.worker_id == any_(func.array(read.scalar_subquery()))
    else:
        of_workers = table.c.worker_id.in_(read)
    query = select(*columns).where(
        of_workers,
        table.c.metric == bindparam("metric"),
        table.c.gpu.in_([literal_column(str(int(g)), SmallInteger) for g in shape.gpus]),
        table.c.ts >= bindparam("lower"),
        table.c.ts <= bindparam("end"),
    )
    if shape.machines:
        query = query.where(
            table.c.machine_id.in_(
                select(MACHINES.c.id).where(_one_of(MACHINES.c.name, "machines", shape.machines))
            )
        )
    return query


def _per_series(source: Subquery, shape: _Shape) -> Select[Any]:
    series = [source.c.worker_id, source.c.gpu]
    if shape.needs_machine:
        series.append(source.c.machine_id)
    if shape.within_series == "rate":
        return _rates(source, shape, series)
    bucket = step_start(source.c.ts, shape.step_ms)
    value = getattr(func, shape.within_series)(source.c.value)
    return select(*series, bucket.label("b"), value.label("v")).group_by(*series, bucket)


def _rates(source: Subquery, shape: _Shape, series: list[Any]) -> Select[Any]:
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
    bucket = step_start(lagged.c.ts, shape.step_ms)
    return (
        select(*kept, bucket.label("b"), per_second.label("v"))
        .where(lagged.c.pt.is_not(None), lagged.c.ts >= bindparam("start"))
        .group_by(*kept, bucket)
    )


def _combined(per_series: Subquery, shape: _Shape) -> Select[Any]:
    joined: Any = per_series
    wants = set(shape.by)
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
    labels = [column[label] for label in shape.by]
    # a float on both databases (a rate is a numeric on PostgreSQL): the rows are the points
    value = cast(getattr(func, shape.agg)(per_series.c.v), Float)
    return (
        select(
            literal_column(str(_BUCKET)).label("part"),
            *(label.label(f"label_{i}") for i, label in enumerate(labels)),
            per_series.c.b.label("b"),
            value.label("v"),
            *(null() for _ in range(_SCOPE_COLUMNS)),
        )
        .select_from(joined)
        .group_by(*labels, per_series.c.b)
    )
