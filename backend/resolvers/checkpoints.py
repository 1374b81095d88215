"""Resolvers of the checkpoint advice."""

from __future__ import annotations

from backend.accounting import checkpoint_advice
from backend.request.context import Info
from backend.schema.checkpoints import CauseCount, CheckpointAdvice


async def checkpoint_advice_of(
    info: Info, run: str, workspace: str | None = None
) -> CheckpointAdvice:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await checkpoint_advice.advice(
            session, info.context.clock, principal, run, workspace
        )
    return CheckpointAdvice(
        run=found.run,
        gpus=found.gpus,
        checkpoints=found.checkpoints,
        cost_seconds=found.cost_s,
        interval_seconds=found.interval_s,
        scope=found.scope,
        failures=found.failures,
        failures_by_cause=[
            CauseCount(cause=c, count=n) for c, n in found.failures_by_cause.items()
        ],
        gpu_hours=found.gpu_hours,
        mtbf_seconds=found.mtbf_s,
        optimal_interval_seconds=found.optimal_interval_s,
        gpu_hours_saved_per_week=found.gpu_hours_saved_per_week,
        sentence=found.sentence,
    )
