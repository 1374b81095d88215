"""The SQL of goodput accounting's ledger sums: the hourly and daily cells a report, a week,
a run, the Prometheus exposition or an alert adds up over a period (the fewest cells that make
it), each scope's ledger with its name, and the names and ids of what the ledgers are of. The
intervals behind a figure are read in interval_queries.py, the exposition's other reads in
prometheus_queries.py, a series' in series_queries.py; the tick's writes in repository.py and
ledger_writes.py."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    String,
    and_,
    bindparam,
    false,
    func,
    literal_column,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting.repository import _TIME, _batches, _dialect, _in
from backend.accounting.rules import CATEGORIES, HOUR
from backend.db.engine import driver_connection
from backend.models import (
    Cluster,
    GoodputDay,
    GoodputHour,
    GoodputRunTotal,
    Machine,
    Pool,
    Run,
    Workspace,
)
from backend.models.goodput import TOTAL_COLUMNS


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
