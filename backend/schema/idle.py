"""GraphQL types of idle policies (issue 41): a run's policy, and what a workspace's policies
did."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import strawberry

from backend.schema.common import UserError


@strawberry.type(
    description='A run\'s idle policy (spec "idle"): when every GPU of the run stays under the '
    "utilization, each whole minute, for the window, the run is stopped (or its workspace told)."
)
class IdlePolicy:
    gpu_utilization_below: float = strawberry.field(description="Percent, each minute's mean.")
    window: str = strawberry.field(description='The spec\'s "for": 30m, 2h…')
    action: str = strawberry.field(description="stop or notify.")

    @classmethod
    def stored(cls, data: dict[str, Any] | None) -> IdlePolicy | None:
        """From its JSON as stored (a pool's default)."""
        if data is None:
            return None
        return cls(
            gpu_utilization_below=float(data["gpu_utilization_below"]),
            window=str(data["for"]),
            action=str(data["action"]),
        )


@strawberry.type(description="A pool's default idle policy, as its organisation's admins set it.")
class PoolIdlePolicy:
    cluster: str
    pool: str
    idle_policy: IdlePolicy | None = strawberry.field(description="Null: none.")


@strawberry.type
class PoolIdlePolicyPayload:
    pool: PoolIdlePolicy | None
    errors: list[UserError]


@strawberry.type(description="One thing a run's idle policy did.")
class IdleAction:
    run: str
    action: str = strawberry.field(description="stop or notify.")
    at: datetime
    idle_since: datetime = strawberry.field(description="The window's start: idle since then.")
    gpus: int = strawberry.field(description="The GPUs the run held (a notice gives none back).")
    reason: str
    gpu_hours_given_back: float = strawberry.field(
        description="Its GPUs from its stop to now (or its time limit), within the period."
    )


@strawberry.type(
    description="What the workspace's idle policies did over the last days: the GPU-hours "
    "their stops gave back, the idle GPU-hours the stopped runs had held over their windows, "
    "and each stop and notice, newest first."
)
class IdleReport:
    since: datetime
    gpu_hours_given_back: float
    idle_gpu_hours_found: float
    runs_stopped: int
    actions: list[IdleAction]
