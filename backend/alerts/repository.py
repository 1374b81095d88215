"""All SQL of alerts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import (
    Alert,
    AlertThreshold,
    Cluster,
    Gpu,
    Machine,
    Run,
    SlurmImport,
    Worker,
    Workspace,
)


async def clusters(session: AsyncSession) -> list[Cluster]:
    return list(await session.scalars(select(Cluster).order_by(Cluster.id)))


async def thresholds(session: AsyncSession, cluster_id: int) -> dict[str, float]:
    rows = await session.scalars(
        select(AlertThreshold).where(AlertThreshold.cluster_id == cluster_id)
    )
    return {r.name: r.value for r in rows}


async def threshold(session: AsyncSession, cluster_id: int, name: str) -> AlertThreshold | None:
    return await session.scalar(
        select(AlertThreshold).where(
            AlertThreshold.cluster_id == cluster_id, AlertThreshold.name == name
        )
    )


async def firing(session: AsyncSession, cluster_ids: Sequence[int]) -> list[Alert]:
    return list(
        await session.scalars(
            select(Alert)
            .where(Alert.cluster_id.in_(cluster_ids), Alert.resolved_at.is_(None))
            .order_by(Alert.fired_at, Alert.id)
        )
    )


async def workspaces(session: AsyncSession, organization_id: int) -> dict[int, str]:
    rows = await session.execute(
        select(Workspace.id, Workspace.name).where(Workspace.organization_id == organization_id)
    )
    return {r.id: r.name for r in rows}


async def stalled_by_workspace(session: AsyncSession, cluster_id: int) -> dict[int, int]:
    rows = await session.execute(
        select(Run.workspace_id, func.count())
        .join(Worker, Worker.run_id == Run.id)
        .where(
            Run.cluster_id == cluster_id,
            Worker.state == "Running",
            Worker.stalled_since.is_not(None),
        )
        .group_by(Run.workspace_id)
    )
    return {r[0]: int(r[1]) for r in rows}


async def straggling_by_workspace(
    session: AsyncSession, cluster_id: int, slow_before: object
) -> dict[int, int]:
    rows = await session.execute(
        select(Run.workspace_id, func.count(func.distinct(Run.id)))
        .join(Worker, Worker.run_id == Run.id)
        .where(
            Run.cluster_id == cluster_id,
            Worker.state == "Running",
            Worker.slow_since.is_not(None),
            Worker.slow_since <= slow_before,
        )
        .group_by(Run.workspace_id)
    )
    return {r[0]: int(r[1]) for r in rows}


async def unhealthy_gpus(session: AsyncSession, cluster_id: int) -> int:
    found = await session.scalar(
        select(func.count())
        .select_from(Gpu)
        .join(Machine, Machine.id == Gpu.machine_id)
        .where(Machine.cluster_id == cluster_id, Gpu.health != "ok")
    )
    return int(found or 0)


async def slurm_read_at(session: AsyncSession, cluster_id: int) -> datetime | None:
    """When a Slurm-backed cluster's import last read its Slurm; before it ever did, since when
    it reads (its first import's time); None: not imported at all."""
    row = await session.get(SlurmImport, cluster_id)
    if row is None:
        return None
    return row.imported_at or row.since
