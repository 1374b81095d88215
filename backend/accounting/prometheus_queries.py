"""The SQL of what the goodput exposition reads beside the ledgers' sums: the workspaces'
time by cluster, runs still going, workers stalled, runs with a straggler, unhealthy GPUs and
Slurm imports now, and the names of workspaces and clusters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.lifecycle.states import ENDED_RUN_STATES
from backend.models import Cluster, GoodputHour, Gpu, Machine, Run, SlurmImport, Worker, Workspace


async def workspaces(
    session: AsyncSession, organization_id: int, ids: Sequence[int] | None
) -> dict[int, str]:
    query = select(Workspace.id, Workspace.name).where(Workspace.organization_id == organization_id)
    if ids is not None:
        query = query.where(Workspace.id.in_(ids))
    return {r.id: r.name for r in await session.execute(query)}


async def cluster_sums(
    session: AsyncSession, start: datetime, end: datetime, workspace_ids: Sequence[int]
) -> list[tuple[int, str, bool, float]]:
    """(cluster id, category, held, GPU-seconds): the workspaces' time by cluster."""
    rows = await session.execute(
        select(
            GoodputHour.cluster_id,
            GoodputHour.category,
            GoodputHour.held,
            func.sum(GoodputHour.gpu_seconds),
        )
        .where(
            GoodputHour.scope == "workspace",
            GoodputHour.hour >= start,
            GoodputHour.hour < end,
            GoodputHour.workspace_id.in_(workspace_ids),
        )
        .group_by(GoodputHour.cluster_id, GoodputHour.category, GoodputHour.held)
    )
    return [(r[0], r[1], bool(r[2]), float(r[3])) for r in rows]


async def unhealthy_gpus(session: AsyncSession, organization_id: int) -> list[tuple[str, int]]:
    """(cluster name, its GPUs unhealthy now) of every cluster of the organisation, by name."""
    unhealthy = func.count(Gpu.id).filter(Gpu.health != "ok")
    rows = await session.execute(
        select(Cluster.name, unhealthy)
        .select_from(Cluster)
        .outerjoin(Machine, Machine.cluster_id == Cluster.id)
        .outerjoin(Gpu, Gpu.machine_id == Machine.id)
        .where(Cluster.organization_id == organization_id)
        .group_by(Cluster.name)
        .order_by(Cluster.name)
    )
    return [(r[0], int(r[1])) for r in rows]


@dataclass(frozen=True)
class SlurmImportState:
    """Where a Slurm-backed cluster's import stands, as the exposition shows it."""

    cluster: str
    last_read: datetime  # the last successful import, else since when it reads
    failing: bool  # its last try failed
    quarantined: int


async def slurm_imports(session: AsyncSession, organization_id: int) -> list[SlurmImportState]:
    """The organisation's Slurm-backed clusters' imports, by cluster name."""
    rows = await session.execute(
        select(Cluster.name, SlurmImport)
        .join(SlurmImport, SlurmImport.cluster_id == Cluster.id)
        .where(Cluster.organization_id == organization_id)
        .order_by(Cluster.name)
    )
    return [
        SlurmImportState(
            cluster=name,
            last_read=state.imported_at or state.since,
            failing=state.error_at is not None
            and (state.imported_at is None or state.error_at >= state.imported_at),
            quarantined=len(state.quarantined or {}),
        )
        for name, state in rows
    ]


async def cluster_names(session: AsyncSession, ids: Sequence[int]) -> dict[int, str]:
    rows = await session.execute(select(Cluster.id, Cluster.name).where(Cluster.id.in_(ids)))
    return {r.id: r.name for r in rows}


async def live_runs(session: AsyncSession, workspace_ids: Sequence[int]) -> list[Run]:
    """Runs still going (not ended, not deleted) of the workspaces."""
    return list(
        await session.scalars(
            select(Run).where(
                Run.workspace_id.in_(workspace_ids),
                Run.state.not_in(ENDED_RUN_STATES),
                Run.deleted_at.is_(None),
            )
        )
    )


async def stalled_workers(session: AsyncSession, workspace_ids: Sequence[int]) -> dict[int, int]:
    """Workers stalled now, by workspace."""
    rows = await session.execute(
        select(Run.workspace_id, func.count())
        .join(Worker, Worker.run_id == Run.id)
        .where(
            Run.workspace_id.in_(workspace_ids),
            Worker.state == "Running",
            Worker.stalled_since.is_not(None),
        )
        .group_by(Run.workspace_id)
    )
    return {r[0]: int(r[1]) for r in rows}


async def runs_with_straggler(
    session: AsyncSession, workspace_ids: Sequence[int], slow_before: datetime
) -> dict[int, int]:
    """Runs with a worker slow since ``slow_before`` or earlier (a straggler now), by workspace."""
    rows = await session.execute(
        select(Run.workspace_id, func.count(func.distinct(Run.id)))
        .join(Worker, Worker.run_id == Run.id)
        .where(
            Run.workspace_id.in_(workspace_ids),
            Worker.state == "Running",
            Worker.slow_since.is_not(None),
            Worker.slow_since <= slow_before,
        )
        .group_by(Run.workspace_id)
    )
    return {r[0]: int(r[1]) for r in rows}
