"""All SQL of the scheduling domain: what one pass reads about a cluster."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Row, Table, bindparam, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import Cluster, Gpu, Machine, Pool, Run, Worker, Workspace, WorkspaceQuota
from backend.runs.rules import ENDED_RUN_STATES

SCHEDULING_LOCK = 0x5CED  # the advisory lock namespace of scheduling passes


async def lock_cluster(session: AsyncSession, cluster_id: int) -> None:
    """One pass at a time per cluster, across every process: two passes deciding at once could
    give the same GPUs twice. Both locks last to the end of the transaction."""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(
            text("SELECT pg_advisory_xact_lock(:space, :key)"),
            {"space": SCHEDULING_LOCK, "key": cluster_id},
        )
    else:
        # SQLite has one writer at a time: writing first makes the pass that writer before it
        # reads anything, so a second pass waits (busy_timeout) until this one commits.
        await session.execute(
            update(Cluster).where(Cluster.id == cluster_id).values(name=Cluster.name)
        )


async def cluster_ids(session: AsyncSession) -> list[int]:
    return list(await session.scalars(select(Cluster.id).order_by(Cluster.id)))


async def cluster_policy(session: AsyncSession, cluster_id: int) -> tuple[str, bool]:
    """The cluster's name, and whether its admins let runs preempt over-quota workspaces."""
    row = (
        await session.execute(
            select(Cluster.name, Cluster.preempt_over_quota).where(Cluster.id == cluster_id)
        )
    ).one()
    return str(row.name), bool(row.preempt_over_quota)


async def machines(session: AsyncSession, cluster_id: int) -> list[tuple[Machine, str | None]]:
    rows = await session.execute(
        select(Machine, Pool.name)
        .outerjoin(Pool, Pool.id == Machine.pool_id)
        .where(Machine.cluster_id == cluster_id, Machine.state != "removed")
        .order_by(Machine.name)
    )
    return [(m, pool) for m, pool in rows]


async def gpus(session: AsyncSession, cluster_id: int) -> dict[int, list[tuple[int, str]]]:
    """(index, health) of every GPU of the cluster, by machine."""
    rows = await session.execute(
        select(Gpu.machine_id, Gpu.index, Gpu.health)
        .join(Machine, Machine.id == Gpu.machine_id)
        .where(Machine.cluster_id == cluster_id)
    )
    grouped: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for machine_id, index, health in rows:
        grouped[machine_id].append((index, health))
    return grouped


async def placed_workers(session: AsyncSession, cluster_id: int) -> list[tuple[Worker, Run]]:
    """Every worker that holds room on a machine of the cluster, with its run."""
    rows = await session.execute(
        select(Worker, Run)
        .join(Run, Run.id == Worker.run_id)
        .where(Run.cluster_id == cluster_id, Worker.machine_id.is_not(None))
        .order_by(Run.id, Worker.rank)
    )
    return [(w, r) for w, r in rows]


async def pending_runs(session: AsyncSession, cluster_id: int) -> list[Row[Any]]:
    """What placement needs of each pending run, as plain rows (thousands of them per pass)."""
    rows = await session.execute(
        select(
            Run.id,
            Run.name,
            Run.workspace_id,
            Run.priority,
            Run.created_at,
            Run.worker_count,
            Run.gpus_per_worker,
            Run.spec,
            Run.restart_at,
            Run.reason,
            Run.waits_for,
            Run.cause,
        ).where(Run.cluster_id == cluster_id, Run.state == "Pending", Run.deleted_at.is_(None))
    )
    return list(rows)


async def quotas(session: AsyncSession, cluster_id: int) -> list[tuple[int, str, int]]:
    rows = await session.execute(
        select(WorkspaceQuota.workspace_id, Workspace.name, WorkspaceQuota.gpus)
        .join(Workspace, Workspace.id == WorkspaceQuota.workspace_id)
        .where(WorkspaceQuota.cluster_id == cluster_id)
    )
    return [(r[0], r[1], r[2]) for r in rows]


async def workspace_names(session: AsyncSession, ids: Sequence[int]) -> dict[int, str]:
    rows = await session.execute(select(Workspace.id, Workspace.name).where(Workspace.id.in_(ids)))
    return {r.id: r.name for r in rows}


async def master_ports_in_use(session: AsyncSession) -> dict[int, set[int]]:
    """The MASTER_PORT of every live run, by the machine its rank 0 is on."""
    rows = await session.execute(
        select(Worker.machine_id, Run.master_port)
        .join(Worker, Worker.run_id == Run.id)
        .where(
            Worker.rank == 0,
            Worker.machine_id.is_not(None),
            Run.master_port.is_not(None),
            Run.state.not_in([s.value for s in ENDED_RUN_STATES]),
        )
    )
    used: dict[int, set[int]] = defaultdict(set)
    for machine_id, port in rows:
        if machine_id is not None and port is not None:
            used[machine_id].add(port)
    return used


async def machine_addresses(session: AsyncSession, ids: Sequence[int]) -> dict[int, str]:
    """The address each machine's agent advertised (those that did)."""
    rows = await session.execute(
        select(Machine.id, Machine.address).where(Machine.id.in_(ids), Machine.address.is_not(None))
    )
    return {r.id: r.address for r in rows if r.address}


async def set_reasons(session: AsyncSession, reasons: list[dict[str, Any]]) -> None:
    """Change pending runs' sentences and what each says they wait for, in one executemany
    (no history: the state is unchanged); a sentence of the scheduler's has no cause (a
    restart's is replaced with it)."""
    if reasons:
        table = cast(Table, Run.__table__)
        await session.execute(
            update(table)
            .where(table.c.id == bindparam("run_id"))
            .values(reason=bindparam("text"), waits_for=bindparam("wait"), cause=None),
            [{"run_id": r["id"], "text": r["reason"], "wait": r["waits_for"]} for r in reasons],
        )
