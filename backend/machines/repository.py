"""All SQL of the machines domain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, Table, bindparam, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from backend.lifecycle.states import ENDED_RUN_STATES
from backend.machines.rules import SLURM
from backend.models import (
    Cluster,
    Gpu,
    GpuFault,
    LeaseCheck,
    Machine,
    Pool,
    Run,
    Worker,
    WorkerFailure,
)

MACHINES = cast(Table, Machine.__table__)

# A machine whose lease a heartbeat renews: one that is not lost (a lost one registers again),
# or a Slurm node's, whatever Slurm says of the node (its agent only watches).
LIVE = ("ready", "draining")


def _renewable() -> ColumnElement[bool]:
    return or_(Machine.state.in_(LIVE), Machine.executor == SLURM)


async def get_machine(session: AsyncSession, cluster_id: int, name: str) -> Machine | None:
    return await session.scalar(
        select(Machine).where(Machine.cluster_id == cluster_id, Machine.name == name)
    )


async def get_cluster(session: AsyncSession, cluster_id: int) -> Cluster | None:
    return await session.get(Cluster, cluster_id)


async def get_or_create_pool(
    session: AsyncSession, cluster_id: int, name: str, at: datetime
) -> Pool:
    pool = await session.scalar(
        select(Pool).where(Pool.cluster_id == cluster_id, Pool.name == name)
    )
    if pool is None:
        pool = Pool(cluster_id=cluster_id, name=name, created_at=at)
        session.add(pool)
        await session.flush()
    return pool


async def gpus_of(session: AsyncSession, machine_id: int) -> list[Gpu]:
    return list(
        await session.scalars(select(Gpu).where(Gpu.machine_id == machine_id).order_by(Gpu.index))
    )


LEASE_CHECK_ID = 1


async def record_lease_check(session: AsyncSession, now: datetime) -> datetime | None:
    """Record this check of the leases, locked until commit (one check at a time), and return
    when the one before it was, if any."""
    updated = await session.execute(
        update(LeaseCheck)
        .where(LeaseCheck.id == LEASE_CHECK_ID)
        .values(previous_at=LeaseCheck.checked_at, checked_at=now)
    )
    if not updated.rowcount:  # type: ignore[attr-defined]
        # The first check. Two processes starting at once both find no row: the second's
        # insert waits for the first's and fails on its key (issue 19); it updates the row the
        # first wrote instead, as any later check does.
        try:
            async with session.begin_nested():
                session.add(LeaseCheck(id=LEASE_CHECK_ID, checked_at=now, previous_at=None))
            return None
        except IntegrityError:
            await session.execute(
                update(LeaseCheck)
                .where(LeaseCheck.id == LEASE_CHECK_ID)
                .values(previous_at=LeaseCheck.checked_at, checked_at=now)
            )
    check = await session.get(LeaseCheck, LEASE_CHECK_ID, populate_existing=True)
    assert check is not None
    return check.previous_at


async def expired_machines(session: AsyncSession, now: datetime) -> list[Machine]:
    return list(
        await session.scalars(
            select(Machine)
            .where(
                Machine.state.in_(["ready", "draining"]),
                Machine.lease_expires_at.is_not(None),
                Machine.lease_expires_at < now,
                # a Slurm node's agent gone is no node lost: Slurm says that (backend/slurm/)
                or_(Machine.executor.is_(None), Machine.executor != SLURM),
            )
            .with_for_update()
        )
    )


async def extend_lease(
    session: AsyncSession, machine_id: int, now: datetime, until: datetime
) -> bool:
    result = await session.execute(
        update(Machine)
        .where(Machine.id == machine_id, _renewable())
        .values(last_seen_at=now, lease_expires_at=until)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def renew_leases(
    session: AsyncSession, seen: Mapping[int, datetime], until: datetime
) -> tuple[set[int], set[int]]:
    """Renew the leases of these machines (those still ready or draining) whose rows no other
    transaction holds, without waiting for any (PostgreSQL: FOR NO KEY UPDATE SKIP LOCKED;
    SQLite's one writer holds them all): one statement to lock, one to renew, each machine
    last seen when ``seen`` says. Returns the ids renewed and the ids whose rows were held
    (another transaction writing the machine: its Hello, which renews the lease itself, or a
    check finding it lost), to be tried again."""
    rows = await session.execute(
        select(Machine.id, Machine.state, Machine.executor)
        .where(Machine.id.in_(list(seen)))
        .order_by(Machine.id)
        .with_for_update(key_share=True, skip_locked=True)
    )
    found = {int(machine_id): (state, executor) for machine_id, state, executor in rows}
    live = sorted(m for m, (state, executor) in found.items() if state in LIVE or executor == SLURM)
    if live:
        # One statement run for many rows (psycopg pipelines them): each its own last contact.
        await session.execute(
            update(MACHINES)
            .where(MACHINES.c.id == bindparam("machine"))
            .values(last_seen_at=bindparam("seen"), lease_expires_at=until),
            [{"machine": m, "seen": seen[m]} for m in live],
        )
    return set(live), set(seen) - set(found)


async def extend_all_leases(session: AsyncSession, until: datetime) -> int:
    result = await session.execute(
        update(Machine)
        .where(Machine.state.in_(["ready", "draining"]), Machine.lease_expires_at < until)
        .values(lease_expires_at=until)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def workers_on(session: AsyncSession, machine_id: int) -> list[Worker]:
    return list(await session.scalars(select(Worker).where(Worker.machine_id == machine_id)))


def add(session: AsyncSession, *rows: object) -> None:
    session.add_all(rows)


async def delete_rows(session: AsyncSession, *rows: object) -> None:
    for row in rows:
        await session.delete(row)


async def gpus_in_clusters(
    session: AsyncSession, cluster_ids: Sequence[int]
) -> list[tuple[Gpu, Machine]]:
    """Every GPU of the clusters' machines, by machine name and index."""
    rows = await session.execute(
        select(Gpu, Machine)
        .join(Machine, Machine.id == Gpu.machine_id)
        .where(Machine.cluster_id.in_(cluster_ids))
        .order_by(Machine.name, Gpu.index)
    )
    return [(r[0], r[1]) for r in rows]


async def holders(session: AsyncSession, machine_ids: Sequence[int]) -> list[tuple[Worker, Run]]:
    """The placed workers of runs still going on these machines, with their runs."""
    rows = await session.execute(
        select(Worker, Run)
        .join(Run, Run.id == Worker.run_id)
        .where(
            Worker.machine_id.in_(machine_ids),
            Run.state.not_in(ENDED_RUN_STATES),
            Run.deleted_at.is_(None),
        )
    )
    return [(r[0], r[1]) for r in rows]


async def machines_in_clusters(
    session: AsyncSession, cluster_ids: Sequence[int]
) -> list[tuple[Machine, str, str | None, int, int]]:
    """The clusters' machines: each with its cluster's and pool's names, its GPUs and how
    many of them are unhealthy, by cluster and name."""
    gpus = (
        select(
            Gpu.machine_id,
            func.count().label("gpus"),
            func.count().filter(Gpu.health != "ok").label("unhealthy"),
        )
        .group_by(Gpu.machine_id)
        .subquery()
    )
    rows = await session.execute(
        select(
            Machine,
            Cluster.name,
            Pool.name,
            func.coalesce(gpus.c.gpus, 0),
            func.coalesce(gpus.c.unhealthy, 0),
        )
        .join(Cluster, Cluster.id == Machine.cluster_id)
        .outerjoin(Pool, Pool.id == Machine.pool_id)
        .outerjoin(gpus, gpus.c.machine_id == Machine.id)
        .where(Machine.cluster_id.in_(cluster_ids))
        .order_by(Cluster.name, Machine.name)
    )
    return [(r[0], r[1], r[2], int(r[3]), int(r[4])) for r in rows]


async def pool_names(
    session: AsyncSession, cluster_ids: Sequence[int]
) -> list[tuple[str, str, float | None, str | None, dict[str, Any] | None]]:
    """(cluster, pool, price per GPU-hour, currency, default idle policy) of the clusters'
    pools, machines or not."""
    rows = await session.execute(
        select(Cluster.name, Pool.name, Pool.gpu_hour_price, Pool.currency, Pool.idle_policy)
        .join(Cluster, Cluster.id == Pool.cluster_id)
        .where(Pool.cluster_id.in_(cluster_ids))
    )
    return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]


async def failure_counts(
    session: AsyncSession, machine_ids: Sequence[int], start: datetime, end: datetime
) -> list[tuple[int, str, int | None, int]]:
    """(machine id, cause, exit code, how many) of the workers' failures on these machines in
    [start, end)."""
    if not machine_ids:
        return []
    rows = await session.execute(
        select(
            WorkerFailure.machine_id,
            WorkerFailure.cause,
            WorkerFailure.exit_code,
            func.count(),
        )
        .where(
            WorkerFailure.machine_id.in_(machine_ids),
            WorkerFailure.at >= start,
            WorkerFailure.at < end,
        )
        .group_by(WorkerFailure.machine_id, WorkerFailure.cause, WorkerFailure.exit_code)
    )
    return [(r[0], r[1], r[2], int(r[3])) for r in rows]


async def gpu_fault_counts(
    session: AsyncSession, machine_ids: Sequence[int], start: datetime, end: datetime
) -> list[tuple[int, str, int, int, str]]:
    """(machine id, kind, how many, the latest one's id and sentence) of these machines' GPU
    faults in [start, end): a few rows however many faults an agent sent."""
    if not machine_ids:
        return []
    window = (
        GpuFault.machine_id.in_(machine_ids),
        GpuFault.at >= start,
        GpuFault.at < end,
    )
    counts = await session.execute(
        select(GpuFault.machine_id, GpuFault.kind, func.count(), func.max(GpuFault.id))
        .where(*window)
        .group_by(GpuFault.machine_id, GpuFault.kind)
    )
    found = [(r[0], r[1], int(r[2]), int(r[3])) for r in counts]
    reasons = dict(
        (
            await session.execute(
                select(GpuFault.id, GpuFault.reason).where(GpuFault.id.in_([f[3] for f in found]))
            )
        ).all()
    )
    return [(machine, kind, n, last, reasons.get(last, "")) for machine, kind, n, last in found]
