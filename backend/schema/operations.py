"""What a cluster's operators see and change in GraphQL: alerts firing, thresholds, drains."""

from __future__ import annotations

from datetime import datetime

import strawberry

from backend import models
from backend.request.context import Info
from backend.schema.common import UserError


@strawberry.type(description="A threshold alert firing: what crossed what, and since when.")
class Alert:
    metric: str = strawberry.field(
        description=(
            "goodput_drop, workers_stalled, runs_with_straggler, gpu_faults or slurm_import_lag."
        )
    )
    subject: str = strawberry.field(description="The workspace, pool or cluster it is about.")
    value: float
    threshold: float
    reason: str
    fired_at: datetime

    @classmethod
    def from_model(cls, row: models.Alert) -> Alert:
        return cls(
            metric=row.metric,
            subject=row.subject,
            value=row.value,
            threshold=row.threshold,
            reason=row.reason,
            fired_at=row.fired_at,
        )


@strawberry.type(description="A cluster's threshold, as its operators set it.")
class Threshold:
    name: str
    value: float
    updated_at: datetime


@strawberry.type(
    description="One of a cluster's alert thresholds as it applies now: set, or the default."
)
class ThresholdSetting:
    name: str
    value: float
    default: float = strawberry.field(description="Its value where the operators set none.")
    updated_at: datetime | None = strawberry.field(
        description="When its operators last set it; null: it is the default."
    )


@strawberry.type
class ThresholdPayload:
    threshold: Threshold | None
    errors: list[UserError]


@strawberry.type(description="A workspace, as its organisation's admins set it.")
class WorkspaceSettings:
    name: str
    priority_ceiling: int = strawberry.field(
        description="The highest priority its runs may ask for (default 50); above it a run "
        "is refused at submit."
    )


@strawberry.type
class WorkspaceSettingsPayload:
    workspace: WorkspaceSettings | None
    errors: list[UserError]


@strawberry.type(
    description="A workspace's GPU quota on a cluster, as its organisation's admins set it."
)
class Quota:
    workspace: str
    cluster: str
    gpus: int | None = strawberry.field(
        description="The most GPUs its runs may hold at once there; null: no quota."
    )


@strawberry.type
class QuotaPayload:
    quota: Quota | None
    errors: list[UserError]


@strawberry.type(description="A cluster's preemption policy, as its organisation's admins set it.")
class PreemptionPolicy:
    cluster: str
    preempt_over_quota: bool = strawberry.field(
        description="Whether a higher-priority run may preempt runs of another workspace that "
        "holds more than its quota on the cluster; otherwise runs preempt only their own "
        "workspace's."
    )


@strawberry.type
class PreemptionPolicyPayload:
    policy: PreemptionPolicy | None
    errors: list[UserError]


@strawberry.type(description="A machine, as its operators see it.")
class MachineState:
    name: str
    state: str = strawberry.field(description="ready, draining, or lost.")
    reason: str


@strawberry.type
class MachinePayload:
    machine: MachineState | None
    errors: list[UserError]


@strawberry.type(description="A worker stalled now, or a straggler now.")
class WorkerAttention:
    run: str
    worker: str
    kind: str = strawberry.field(description="stalled or straggler.")
    since: datetime = strawberry.field(description="Stalled from its last progress; slow since.")
    reason: str
    _machine_id: strawberry.Private[int | None]

    @strawberry.field(description="The machine it runs on.")
    async def machine(self, info: Info) -> str | None:
        if self._machine_id is None:
            return None
        return await info.context.loaders.machine_name.load(self._machine_id)
