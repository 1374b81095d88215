"""All SQL of the metrics domain but a range query's (range_queries.py): the tables, the
samples stored as they come, pruned and summarised, each worker's latest."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from typing import Literal, overload

import psycopg
from sqlalchemy import BigInteger, ColumnElement, Table, case, delete, func, literal_column, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from backend.db.bulk import copy_binary
from backend.db.engine import driver_connection
from backend.metrics.rules import COUNTER_IDS, MINUTE_MS, ROW_COLUMNS, Row
from backend.models import (
    Machine,
    MetricMinute,
    MetricSample,
    Run,
    StateTransition,
    Worker,
    Workspace,
)

# Range queries are built on the tables, not the mapped classes: they return plain rows, and a
# Core statement skips the ORM's compile step.
SAMPLES: Table = MetricSample.__table__  # type: ignore[assignment]
MINUTES: Table = MetricMinute.__table__  # type: ignore[assignment]
WORKERS: Table = Worker.__table__  # type: ignore[assignment]
RUNS: Table = Run.__table__  # type: ignore[assignment]
MACHINES: Table = Machine.__table__  # type: ignore[assignment]
HISTORY: Table = StateTransition.__table__  # type: ignore[assignment]
WORKSPACES: Table = Workspace.__table__  # type: ignore[assignment]
_PG_TYPES = ("int8", "int8", "float8", "int8", "int2", "int2")


def is_postgresql(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def step_start(ts: ColumnElement[int], step_ms: int) -> ColumnElement[int]:
    """The start of the step of ``step_ms`` that holds ``ts``: a range query's buckets, the
    minutes pruning summarises."""
    # The step is written into the SQL, not bound: PostgreSQL must see the GROUP BY expression
    # and the selected one as the same, and two parameters never are. It is a checked integer.
    step = literal_column(str(int(step_ms)), BigInteger)
    return (ts // step) * step


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
    if not is_postgresql(session):
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
    if is_postgresql(session):
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


# -- pruning -------------------------------------------------------------------------------------


async def roll_up(session: AsyncSession, before_ms: int) -> int:
    """Summarise raw samples older than ``before_ms`` into one-minute rows (a gauge's mean, a
    counter's last value). A minute already summarised is left as it is, so a rerun is
    harmless."""
    minute = step_start(SAMPLES.c.ts, MINUTE_MS)
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
    dialect = postgresql if is_postgresql(session) else sqlite
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
