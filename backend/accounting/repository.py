"""All SQL of goodput accounting's tick but its ledgers' writes: the tick's mark, the
transitions and recounts it counts, the workers' history and utilisation it reads, their open
and closed intervals; and the helpers the domain's SQL modules share (id lists, the dialect).
The cells and runs' running totals the tick writes, and pruning, are in
backend/accounting/ledger_writes.py; the reports' reads in ledger_queries.py (the cells summed),
interval_queries.py, prometheus_queries.py and series_queries.py."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    DateTime,
    any_,
    bindparam,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting.rules import WINDING_DOWN, PhaseChange
from backend.db.bulk import insert_many
from backend.db.types import UTCDateTime
from backend.metrics.rules import BY_NAME
from backend.models import (
    AccountingMark,
    GoodputHorizon,
    GoodputInterval,
    GoodputOpenInterval,
    GoodputRecount,
    Machine,
    MetricSample,
    Run,
    SlurmImport,
    StateTransition,
    Worker,
)

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


# Written as the partial index's predicate, NOT accounted, on both dialects: the planners use
# the index only for that very expression. (``accounted IS false`` on PostgreSQL and
# ``accounted = 0`` on SQLite each read the whole history: 0.2 to 0.5 s a tick at 3 million
# transitions, growing with the history.)
_UNACCOUNTED = select(
    StateTransition.id, StateTransition.worker_id, StateTransition.transition_at
).where(text("NOT state_transitions.accounted"))


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


async def counted_until(session: AsyncSession) -> datetime | None:
    """How far the tick has counted (no lock: a read)."""
    return await session.scalar(
        select(AccountingMark.counted_until).where(AccountingMark.id == MARK_ID)
    )


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


async def placed_on(session: AsyncSession, workers: dict[int, list[int]]) -> set[tuple[int, int]]:
    """Of the workers asked for by machine, (worker, machine) of those placed on it now."""
    ids = [w for worker_ids in workers.values() for w in worker_ids]
    rows = await session.execute(
        select(Worker.id, Worker.machine_id).where(
            Worker.machine_id.in_(list(workers)), Worker.id.in_(ids)
        )
    )
    return {(w, m) for w, m in rows if m is not None and w in workers.get(m, ())}


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


@dataclass(frozen=True)
class ImportHorizon:
    """A Slurm-backed cluster's import as the tick sees it: when it last read its Slurm (None:
    never), and how far the tick counted its jobs while it was behind (None: it was not)."""

    cluster_id: int
    read_at: datetime | None
    counted_to: datetime | None


async def import_horizons(session: AsyncSession) -> list[ImportHorizon]:
    """Every Slurm-backed cluster's, read as committed: the import's row is not locked (an
    import writing for a minute never holds the tick up)."""
    rows = await session.execute(
        select(SlurmImport.cluster_id, SlurmImport.imported_at, GoodputHorizon.counted_to)
        .outerjoin(GoodputHorizon, GoodputHorizon.cluster_id == SlurmImport.cluster_id)
        .order_by(SlurmImport.cluster_id)
    )
    return [ImportHorizon(r.cluster_id, r.imported_at, r.counted_to) for r in rows]


async def held_clusters(session: AsyncSession) -> dict[int, datetime]:
    """The clusters whose Slurm jobs the tick counts no further than a moment, with it."""
    rows = await session.execute(select(GoodputHorizon.cluster_id, GoodputHorizon.counted_to))
    return {r.cluster_id: r.counted_to for r in rows}


async def hold_cluster(session: AsyncSession, cluster_id: int, counted_to: datetime | None) -> None:
    """The tick counts the cluster's Slurm jobs no further than ``counted_to`` (None: as any
    worker's). The tick's alone: written under its mark."""
    await session.execute(delete(GoodputHorizon).where(GoodputHorizon.cluster_id == cluster_id))
    if counted_to is not None:
        session.add(GoodputHorizon(cluster_id=cluster_id, counted_to=counted_to))
    await session.flush()


async def workers_since(session: AsyncSession, since: dict[int, datetime]) -> dict[int, datetime]:
    """The workers of these clusters' runs that had not ended by the cluster's moment (each
    counted again from it), with the moment."""
    out: dict[int, datetime] = {}
    for cluster_id, at in since.items():
        rows = await session.scalars(
            select(Worker.id)
            .join(Run, Run.id == Worker.run_id)
            .where(Run.cluster_id == cluster_id, Run.ended_at.is_(None) | (Run.ended_at >= at))
        )
        out.update({w: at for w in rows})
    return out


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
    """Forget each worker's closed intervals from its moment on (they are counted again).

    On PostgreSQL in two statements for every worker: two a worker were 3 100 round trips for
    1 550 workers counted again at 5 000 machines, 1.7 s of a 2.5 s tick, and 16 s where the
    tick ran in serve's own process, each round trip waiting for the interpreter (issue 40)."""
    if not moments:
        return
    if _dialect(session) == "postgresql":
        cuts = select(
            func.unnest(bindparam("ids", list(moments), type_=ARRAY(BigInteger))).label("id"),
            func.unnest(
                bindparam("ats", list(moments.values()), type_=ARRAY(DateTime(timezone=True)))
            ).label("at"),
        ).subquery("cuts")
        of_worker = GoodputInterval.worker_id == cuts.c.id
        fetch = {"synchronize_session": "fetch"}  # the session's own rows follow
        await session.execute(
            delete(GoodputInterval)
            .where(of_worker, GoodputInterval.start_at >= cuts.c.at)
            .execution_options(**fetch)
        )
        await session.execute(
            update(GoodputInterval)
            .where(of_worker, GoodputInterval.end_at > cuts.c.at)
            .values(end_at=cuts.c.at)
            .execution_options(**fetch)
        )
        return
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


def _in(column: Any, ids: Sequence[int], dialect: str) -> Any:
    """``column IN ids``: one array parameter on PostgreSQL (a list of 100 000 placeholders
    costs more to prepare than the query takes), placeholders on SQLite."""
    if dialect == "postgresql":
        return column == any_(bindparam(None, list(ids), type_=ARRAY(BigInteger)))
    return column.in_(ids)


_TIME = UTCDateTime()


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


def _batches(ids: Sequence[int], dialect: str) -> list[list[int]]:
    """All at once as one array on PostgreSQL; in slices under SQLite's parameter limit."""
    return [list(ids)] if dialect == "postgresql" else _chunks(ids)


def _chunks(items: Iterable[T], size: int = 5000) -> list[list[T]]:
    seq = list(items)
    return [seq[i : i + size] for i in range(0, len(seq), size)]
