"""All SQL of the organisations domain."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import Cluster, Organization, Pool, Workspace, WorkspaceQuota


async def count_organizations(session: AsyncSession) -> int:
    return int(await session.scalar(select(func.count()).select_from(Organization)) or 0)


async def get_organization_by_name(session: AsyncSession, name: str) -> Organization | None:
    return await session.scalar(select(Organization).where(Organization.name == name))


async def get_workspace_by_name(
    session: AsyncSession, organization_id: int, name: str
) -> Workspace | None:
    return await session.scalar(
        select(Workspace).where(
            Workspace.organization_id == organization_id, Workspace.name == name
        )
    )


async def get_workspace(session: AsyncSession, workspace_id: int) -> Workspace | None:
    return await session.get(Workspace, workspace_id)


async def list_clusters(session: AsyncSession, organization_id: int) -> list[Cluster]:
    rows = await session.scalars(
        select(Cluster).where(Cluster.organization_id == organization_id).order_by(Cluster.name)
    )
    return list(rows)


async def get_pool_by_name(session: AsyncSession, cluster_id: int, name: str) -> Pool | None:
    return await session.scalar(
        select(Pool).where(Pool.cluster_id == cluster_id, Pool.name == name)
    )


async def get_quota(
    session: AsyncSession, workspace_id: int, cluster_id: int
) -> WorkspaceQuota | None:
    return await session.scalar(
        select(WorkspaceQuota).where(
            WorkspaceQuota.workspace_id == workspace_id, WorkspaceQuota.cluster_id == cluster_id
        )
    )


async def list_quotas(session: AsyncSession, cluster_id: int) -> list[tuple[str, int]]:
    """The workspaces with a quota on a cluster, by name, and their GPUs."""
    rows = await session.execute(
        select(Workspace.name, WorkspaceQuota.gpus)
        .join(Workspace, Workspace.id == WorkspaceQuota.workspace_id)
        .where(WorkspaceQuota.cluster_id == cluster_id)
        .order_by(Workspace.name)
    )
    return [(r[0], r[1]) for r in rows]


async def delete(session: AsyncSession, row: object) -> None:
    await session.delete(row)


def add(session: AsyncSession, *rows: object) -> None:
    session.add_all(rows)


async def priced_pools(session: AsyncSession, organization_id: int) -> list[tuple[Pool, str]]:
    """The organisation's pools with a price, each with its cluster's name."""
    rows = await session.execute(
        select(Pool, Cluster.name)
        .join(Cluster, Cluster.id == Pool.cluster_id)
        .where(Cluster.organization_id == organization_id, Pool.gpu_hour_price.is_not(None))
        .order_by(Cluster.name, Pool.name)
    )
    return [(r[0], r[1]) for r in rows]
