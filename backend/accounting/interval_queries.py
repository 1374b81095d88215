"""The SQL of the worker intervals behind goodput's figures: those a ledger figure is made
of (its explanation), the productive ones inside a restart's redo (rework), the held ones on
priced pools (costs), closed or open to the tick's mark; and runs' redos."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, or_, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting.repository import _batches, _dialect, _in, counted_until
from backend.models import GoodputInterval, GoodputOpenInterval, Redo


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
    mark = await counted_until(session)
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


async def _closed_and_open(session: AsyncSession, start: datetime) -> list[tuple[Any, Any]]:
    """The interval tables a read after ``start`` unites, each with its end: the closed
    intervals' own, and the open ones' the tick's mark (when it is past ``start``)."""
    mark = await counted_until(session)
    parts: list[tuple[Any, Any]] = [(GoodputInterval, GoodputInterval.end_at)]
    if mark is not None and mark > start:
        parts.append(
            (GoodputOpenInterval, bindparam("open_end", mark, type_=GoodputInterval.end_at.type))
        )
    return parts


class RedoPiece(NamedTuple):
    """A productive interval inside a restart's redo: what rework is made of. ``scope_id`` is
    the interval's run, machine, pool or workspace."""

    scope_id: int | None
    run_id: int
    start_at: datetime
    end_at: datetime
    gpus: int
    redo_id: int
    restarted_at: datetime
    until: datetime | None
    reached_step: int | None
    checkpoint_step: int | None


_SCOPE_COLUMNS = {
    "run": "run_id",
    "machine": "machine_id",
    "pool": "pool_id",
    "workspace": "workspace_id",
}


async def redo_pieces(
    session: AsyncSession,
    scope: str,
    start: datetime,
    end: datetime,
    *,
    workspace_ids: Sequence[int] | None,
    cluster_id: int | None = None,
    run_ids: Sequence[int] | None = None,
) -> list[RedoPiece]:
    """The productive intervals (closed, and open to the tick's mark) that overlap a redo of
    their run within [start, end), each with its redo: one query from the redos, which are
    few (a restart each), to their runs' intervals by index."""
    redos = select(Redo).where(
        Redo.restarted_at < end, or_(Redo.until.is_(None), Redo.until > start)
    )
    if workspace_ids is not None:
        redos = redos.where(Redo.workspace_id.in_(workspace_ids))
    if run_ids is not None:
        redos = redos.where(Redo.run_id.in_(run_ids))
    found = redos.subquery()
    parts = await _closed_and_open(session, start)
    queries = []
    for model, end_at in parts:
        query = (
            select(
                getattr(model, _SCOPE_COLUMNS[scope]),
                model.run_id,
                model.start_at,
                end_at.label("end_at"),
                model.gpus,
                found.c.id,
                found.c.restarted_at,
                found.c.until,
                found.c.reached_step,
                found.c.checkpoint_step,
            )
            .select_from(found)
            .join(model, model.run_id == found.c.run_id)
            .where(
                model.category == "productive",
                model.held,
                model.start_at < end,
                or_(found.c.until.is_(None), model.start_at < found.c.until),
            )
        )
        if model is GoodputInterval:
            query = query.where(model.end_at > start, model.end_at > found.c.restarted_at)
        if workspace_ids is not None:
            query = query.where(model.workspace_id.in_(workspace_ids))
        if cluster_id is not None:
            query = query.where(model.cluster_id == cluster_id)
        queries.append(query)
    both = union_all(*queries) if len(queries) > 1 else queries[0]
    rows = await session.execute(both)
    return [RedoPiece(*r) for r in rows]


class PricedPiece(NamedTuple):
    """A held interval on a priced pool: what a cost is made of."""

    run_id: int
    workspace_id: int
    pool_id: int
    category: str
    start_at: datetime
    end_at: datetime
    gpus: int


async def priced_pieces(
    session: AsyncSession,
    start: datetime,
    end: datetime,
    pool_ids: Sequence[int],
    *,
    workspace_ids: Sequence[int] | None,
    cluster_id: int | None = None,
) -> list[PricedPiece]:
    """The held intervals (closed, and open to the tick's mark) on these pools overlapping
    [start, end): the GPU time a price turns into money."""
    if not pool_ids:
        return []
    parts = await _closed_and_open(session, start)
    queries = []
    for model, end_at in parts:
        query = select(
            model.run_id,
            model.workspace_id,
            model.pool_id,
            model.category,
            model.start_at,
            end_at.label("end_at"),
            model.gpus,
        ).where(model.held, model.pool_id.in_(pool_ids), model.start_at < end)
        if model is GoodputInterval:
            query = query.where(model.end_at > start)
        if workspace_ids is not None:
            query = query.where(model.workspace_id.in_(workspace_ids))
        if cluster_id is not None:
            query = query.where(model.cluster_id == cluster_id)
        queries.append(query)
    rows = await session.execute(union_all(*queries) if len(queries) > 1 else queries[0])
    return [PricedPiece(*r) for r in rows]


async def redos_of(session: AsyncSession, run_ids: Sequence[int]) -> list[Redo]:
    """Runs' redos, each run's earliest first."""
    if not run_ids:
        return []
    dialect = _dialect(session)
    out: list[Redo] = []
    for chunk in _batches(run_ids, dialect):
        out += await session.scalars(
            select(Redo)
            .where(_in(Redo.run_id, chunk, dialect))
            .order_by(Redo.run_id, Redo.restarted_at, Redo.id)
        )
    return out
