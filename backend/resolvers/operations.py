"""Resolvers of what operators see and change: alerts firing, thresholds, drains."""

from __future__ import annotations

from backend.alerts import service as alerts
from backend.errors import AstraeusError
from backend.jobs import broker as job_broker
from backend.machines import service as machines
from backend.resolvers.context import Info
from backend.runs import service as runs
from backend.schema.common import UserError
from backend.schema.operations import (
    Alert,
    MachinePayload,
    MachineState,
    Threshold,
    ThresholdPayload,
    WorkerAttention,
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
    try:
        async with info.context.db.transaction() as session:
            row = await alerts.set_threshold(
                session, info.context.clock, principal, cluster, name, value
            )
            threshold = Threshold(name=row.name, value=row.value, updated_at=row.updated_at)
    except AstraeusError as error:
        return ThresholdPayload(threshold=None, errors=UserError.from_error(error))
    return ThresholdPayload(threshold=threshold, errors=[])


async def drain_machine(info: Info, cluster: str, machine: str) -> MachinePayload:
    principal = info.context.require_principal()
    try:
        async with info.context.db.transaction() as session:
            row, _ = await machines.drain_by_name(
                session, info.context.clock, principal, cluster, machine
            )
            state = MachineState(name=row.name, state=row.state, reason=row.reason)
    except AstraeusError as error:
        return MachinePayload(machine=None, errors=UserError.from_error(error))
    job_broker.nudge_scheduler()  # its runs wait to be placed again elsewhere
    return MachinePayload(machine=state, errors=[])


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
