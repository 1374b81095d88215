"""Resolvers of idle policies: what a workspace's policies did, a pool's default."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession
from strawberry.scalars import JSON

from backend.idle import service as idle
from backend.organizations import service as organizations
from backend.request.context import Info
from backend.resolvers.mutations import mutate
from backend.schema.idle import (
    IdleAction,
    IdlePolicy,
    IdleReport,
    PoolIdlePolicy,
    PoolIdlePolicyPayload,
)


async def idle_report(info: Info, days: int = 7, workspace: str | None = None) -> IdleReport:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        report = await idle.report(session, info.context.clock, principal, days, workspace)
    return IdleReport(
        since=report.since,
        gpu_hours_given_back=report.gpu_hours_given_back,
        idle_gpu_hours_found=report.idle_gpu_hours_found,
        runs_stopped=report.runs_stopped,
        actions=[
            IdleAction(
                run=d.run,
                action=d.action,
                at=d.at,
                idle_since=d.idle_since,
                gpus=d.gpus,
                reason=d.reason,
                gpu_hours_given_back=d.gpu_hours_given_back,
            )
            for d in report.actions
        ],
    )


async def set_pool_idle_policy(
    info: Info, cluster: str, pool: str, idle: JSON | None = None
) -> PoolIdlePolicyPayload:
    """A pool's default idle policy (issue 41); null or left out: none."""
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> organizations.PoolIdlePolicy:
        organizations.require_admin(principal, "pools' idle policies")
        return await organizations.set_pool_idle_policy(
            session, principal.organization_id, cluster, pool, idle
        )

    return await mutate(
        info,
        work,
        lambda found: PoolIdlePolicyPayload(
            pool=PoolIdlePolicy(
                cluster=found.cluster,
                pool=found.pool,
                idle_policy=IdlePolicy.stored(found.idle_policy),
            ),
            errors=[],
        ),
        lambda errors: PoolIdlePolicyPayload(pool=None, errors=errors),
    )
