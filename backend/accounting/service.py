"""Goodput accounting's entry point: the tick that counts workers' time into the ledgers.

The tick counts whole UTC minutes: everything before the last minute boundary that was not
counted yet (one minute normally; an hour after an outage). What it counted is kept as
intervals (the explanation of every ledger figure) and added to the hourly ledgers, in one
transaction with the mark of how far it counted, so a retried, late, duplicated or
concurrent tick never counts a second twice nor skips one.

A transition recorded after its time had been counted (a stall is found after the fact and
dated back to the worker's last progress) makes the tick take back what it had counted from
that time and count it again (DESIGN §4, invariant 3).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import repository, rules
from backend.accounting.rules import Interval
from backend.clock import Clock
from backend.models import GoodputInterval

# hour, workspace, cluster, scope, scope id, category, held
Cell = tuple[datetime, int, int, str, int, str, bool]


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
    until = minute_floor(now)
    mark = await repository.lock_mark(session, now)
    counted = mark.counted_until
    late = await repository.earliest_unaccounted(session, before=until)
    start = counted if late is None else late if counted is None else min(counted, late)
    if start is None or start >= until:  # nothing to count (yet), or a tick came twice
        if counted is None:
            mark.counted_until = until
        return TickResult(None, mark.counted_until)
    recounted = start if counted is not None and start < counted else None
    if recounted is not None:
        await _take_back(session, recounted)
    workers, rows, cells = await _count(session, start, until)
    await repository.add_intervals(session, rows)
    await repository.add_to_hours(session, cells)
    await repository.mark_accounted(session, before=until)
    mark.counted_until = until
    return TickResult(start, until, recounted, workers, len(rows))


async def _take_back(session: AsyncSession, moment: datetime) -> None:
    """Subtract what was counted from ``moment`` on, and forget those intervals."""
    cells: dict[Cell, float] = defaultdict(float)
    for row in await repository.intervals_after(session, moment):
        part = _as_interval(row, start=max(row.start_at, moment))
        for cell in _cells(part, row.workspace_id, row.cluster_id, row.run_id, row.pool_id):
            cells[cell] -= part.gpu_seconds
    await repository.add_to_hours(session, cells)
    await repository.cut_intervals_at(session, moment)


async def _count(
    session: AsyncSession, start: datetime, until: datetime
) -> tuple[int, list[dict[str, object]], dict[Cell, float]]:
    worker_ids = await repository.workers_to_count(session, start, until)
    if not worker_ids:
        return 0, [], {}
    changes = await repository.phase_changes(session, worker_ids, start, until)
    busy = await repository.minute_utilization(session, worker_ids, start, until)
    info = await repository.worker_info(session, worker_ids)
    pools = await repository.machine_pools(session)
    rows: list[dict[str, object]] = []
    cells: dict[Cell, float] = defaultdict(float)
    for worker_id in worker_ids:
        worker = info.get(worker_id)
        if worker is None:
            continue  # deleted with its run while the tick ran: its time was counted before

        def utilisation(minute: datetime, _: datetime, w: int = worker_id) -> float | None:
            return busy.get((w, int(minute.timestamp()) * 1000))

        for part in rules.intervals(changes[worker_id], start, until, utilisation):
            pool = pools.get(part.machine_id) if part.machine_id is not None else None
            rows.append(
                {
                    "worker_id": worker_id,
                    "worker_name": worker.name,
                    "run_id": worker.run_id,
                    "workspace_id": worker.workspace_id,
                    "cluster_id": worker.cluster_id,
                    "machine_id": part.machine_id,
                    "pool_id": pool,
                    "start_at": part.start,
                    "end_at": part.end,
                    "category": part.category.value,
                    "held": part.held,
                    "gpus": part.gpus,
                }
            )
            cluster = worker.cluster_id
            for cell in _cells(part, worker.workspace_id, cluster, worker.run_id, pool):
                cells[cell] += part.gpu_seconds
    return len(worker_ids), rows, cells


def _cells(part: Interval, workspace: int, cluster: int, run: int, pool: int | None) -> list[Cell]:
    """The ledger cells an interval counts in: its run, its workspace, its machine and pool
    (where it held GPUs on one)."""
    hour = part.start.replace(minute=0, second=0, microsecond=0)
    key = (part.category.value, part.held)
    scopes = [("run", run), ("workspace", workspace)]
    if part.machine_id is not None:
        scopes.append(("machine", part.machine_id))
    if pool is not None:
        scopes.append(("pool", pool))
    return [(hour, workspace, cluster, scope, scope_id, *key) for scope, scope_id in scopes]


def _as_interval(row: GoodputInterval, *, start: datetime) -> Interval:
    return Interval(
        start, row.end_at, rules.Category(row.category), row.held, row.gpus, row.machine_id
    )
