"""GraphQL type of the checkpoint advice (issue 41)."""

from __future__ import annotations

import strawberry


@strawberry.type(description="How many of a run's interruptions had one cause.")
class CauseCount:
    cause: str
    count: int


@strawberry.type(
    description="How often a run should checkpoint: its checkpoints' measured cost and interval, "
    "the mean time between failures of the machines it runs on (its pool's, else its "
    "cluster's, over 30 days, per GPU-hour, scaled to its GPUs), and the Young-Daly interval "
    "√(2 × cost × MTBF) with the GPU-hours a week of running it would save. Null figures: not "
    "measured, or not enough failures to estimate (the sentence says which)."
)
class CheckpointAdvice:
    run: str
    gpus: int
    checkpoints: int = strawberry.field(description="The checkpoints its workers reported.")
    cost_seconds: float | None = strawberry.field(
        description="The median pause in its steps around a checkpoint."
    )
    interval_seconds: float | None = strawberry.field(
        description="The median time between two checkpoints of a worker."
    )
    scope: str = strawberry.field(description='Where failures are counted: "pool h100".')
    failures: int = strawberry.field(
        description="Runs' interruptions there over 30 days (a gang's failures in a minute: one)."
    )
    failures_by_cause: list[CauseCount]
    gpu_hours: float = strawberry.field(description="GPU-hours held there over 30 days.")
    mtbf_seconds: float | None = strawberry.field(
        description="The mean time between this run's interruptions, for its GPUs."
    )
    optimal_interval_seconds: float | None
    gpu_hours_saved_per_week: float | None
    sentence: str
