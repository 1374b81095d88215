"""Resolvers of what operators see and change: alerts firing, thresholds, drains."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from backend.alerts import service as alerts
from backend.machines import service as machines
from backend.organizations import service as organizations
from backend.request.context import Info
from backend.resolvers.mutations import mutate
from backend.runs import service as runs
from backend.schema.machines import PoolPrice, PoolPricePayload
from backend.schema.operations import (
    Alert,
    MachinePayload,
    MachineState,
    PreemptionPolicy,
    PreemptionPolicyPayload,
    Quota,
    QuotaPayload,
    Threshold,
    ThresholdPayload,
    ThresholdSetting,
    WorkerAttention,
    WorkspaceSettings,
    WorkspaceSettingsPayload,
)


async def alerts_firing(info: Info) -> list[Alert]:
    """Alerts firing that the caller may see: its workspace's; every one of the organisation
    for its admins."""
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await alerts.firing_for(session, principal)
    return [Alert.from_model(a) for a in found]


async def set_threshold(info: Info, cluster: str, name: str, value: float) -> ThresholdPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> Threshold:
        row = await alerts.set_threshold(
            session, info.context.clock, principal, cluster, name, value
        )
        return Threshold(name=row.name, value=row.value, updated_at=row.updated_at)

    return await mutate(
        info,
        work,
        lambda threshold: ThresholdPayload(threshold=threshold, errors=[]),
        lambda errors: ThresholdPayload(threshold=None, errors=errors),
    )


async def drain_machine(info: Info, cluster: str, machine: str) -> MachinePayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> MachineState:
        row, _ = await machines.drain_by_name(
            session, info.context.clock, principal, cluster, machine
        )
        return MachineState(name=row.name, state=row.state, reason=row.reason)

    return await mutate(
        info,
        work,
        lambda state: MachinePayload(machine=state, errors=[]),
        lambda errors: MachinePayload(machine=None, errors=errors),
    )


async def set_priority_ceiling(
    info: Info, workspace: str, ceiling: int
) -> WorkspaceSettingsPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> WorkspaceSettings:
        organizations.require_admin(principal, "a workspace's priority ceiling")
        ws = await organizations.set_priority_ceiling(
            session, principal.organization_id, workspace, ceiling
        )
        return WorkspaceSettings(name=ws.name, priority_ceiling=ws.priority_ceiling)

    return await mutate(
        info,
        work,
        lambda found: WorkspaceSettingsPayload(workspace=found, errors=[]),
        lambda errors: WorkspaceSettingsPayload(workspace=None, errors=errors),
    )


async def set_preemption_policy(
    info: Info, cluster: str, preempt_over_quota: bool
) -> PreemptionPolicyPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> PreemptionPolicy:
        organizations.require_admin(principal, "a cluster's preemption policy")
        row = await organizations.set_preemption_policy(
            session, principal.organization_id, cluster, preempt_over_quota
        )
        return PreemptionPolicy(cluster=row.name, preempt_over_quota=row.preempt_over_quota)

    return await mutate(
        info,
        work,
        lambda policy: PreemptionPolicyPayload(policy=policy, errors=[]),
        lambda errors: PreemptionPolicyPayload(policy=None, errors=errors),
    )


async def set_quota(
    info: Info, workspace: str, cluster: str, gpus: int | None = None
) -> QuotaPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> int | None:
        organizations.require_admin(principal, "quotas")
        return await organizations.set_quota(
            session, principal.organization_id, workspace, cluster, gpus
        )

    return await mutate(
        info,
        work,
        lambda limit: QuotaPayload(
            quota=Quota(workspace=workspace, cluster=cluster, gpus=limit), errors=[]
        ),
        lambda errors: QuotaPayload(quota=None, errors=errors),
    )


async def quota(info: Info, cluster: str, workspace: str | None = None) -> Quota:
    """A workspace's GPU quota on a cluster: members read their own workspace's; admins any
    workspace of their organisation (issue 21)."""
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        name, gpus = await organizations.read_quota(session, principal, cluster, workspace)
    return Quota(workspace=name, cluster=cluster, gpus=gpus)


async def quotas(info: Info, cluster: str) -> list[Quota]:
    """Every workspace's GPU quota on a cluster (issue 21): the organisation's admins."""
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await organizations.quotas_of(session, principal, cluster)
    return [Quota(workspace=name, cluster=cluster, gpus=gpus) for name, gpus in found]


async def thresholds(info: Info, cluster: str) -> list[ThresholdSetting]:
    """A cluster's alert thresholds as they apply now (issue 21): its operators only."""
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await alerts.thresholds_of(session, principal, cluster)
    return [
        ThresholdSetting(name=t.name, value=t.value, default=t.default, updated_at=t.updated_at)
        for t in found
    ]


async def attention(info: Info, workspace: str | None = None) -> list[WorkerAttention]:
    """Workers stalled now, then stragglers now (seed: listed first on the goodput page)."""
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await runs.needing_attention(
            session, principal, info.context.clock.now(), workspace
        )
    return [
        WorkerAttention(
            run=a.run,
            worker=a.worker,
            kind=a.kind,
            since=a.since,
            reason=a.reason,
            _machine_id=a.machine_id,
        )
        for a in found
    ]


async def set_pool_price(
    info: Info,
    cluster: str,
    pool: str,
    price_per_gpu_hour: float | None = None,
    currency: str = "USD",
) -> PoolPricePayload:
    """A pool's price per GPU-hour (issue 23: cost); null or left out: no price."""
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> organizations.PoolPrice:
        organizations.require_admin(principal, "pools' prices")
        return await organizations.set_pool_price(
            session, principal.organization_id, cluster, pool, price_per_gpu_hour, currency
        )

    return await mutate(
        info,
        work,
        lambda found: PoolPricePayload(
            price=PoolPrice(
                cluster=found.cluster,
                pool=found.pool,
                price_per_gpu_hour=found.gpu_hour_price,
                currency=found.currency,
            ),
            errors=[],
        ),
        lambda errors: PoolPricePayload(price=None, errors=errors),
    )
