"""What the idle check reads and writes: the running runs with a policy, their GPUs' minute
means, what each policy did."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.metrics.rules import BY_NAME
from backend.models import IdleAction, MetricSample, Run, Worker, Workspace

UTILIZATION = BY_NAME["task_gpu_utilization_ratio"].id
RUNNING = "Running"


@dataclass(frozen=True)
class Candidate:
    id: int
    name: str
    workspace_id: int
    organization_id: int
    running_since: datetime | None
    started_at: datetime | None
    policy: dict[str, Any]
    spec_time_limit: str | None
    notified_at: datetime | None


async def candidates(session: AsyncSession) -> list[Candidate]:
    """The runs running whole, winding down for nothing, that have an idle policy."""
    rows = await session.execute(
        select(
            Run.id,
            Run.name,
            Run.workspace_id,
            Workspace.organization_id,
            Run.running_since,
            Run.started_at,
            Run.idle_policy,
            Run.spec["time_limit"].as_string(),
            Run.idle_notified_at,
        )
        .join(Workspace, Workspace.id == Run.workspace_id)
        .where(
            Run.state == RUNNING,
            Run.stop_cause.is_(None),
            Run.idle_policy.is_not(None),
            Run.deleted_at.is_(None),
        )
        .order_by(Run.id)
    )
    return [Candidate(*row) for row in rows if row[6]]


async def gpu_workers(session: AsyncSession, run_id: int) -> list[int]:
    """The run's workers that hold GPUs."""
    return list(
        await session.scalars(select(Worker.id).where(Worker.run_id == run_id, Worker.gpus > 0))
    )


async def gpu_minute_means(
    session: AsyncSession, worker_ids: Sequence[int], start: datetime, end: datetime
) -> dict[tuple[int, int], list[float]]:
    """Each GPU's mean utilization by (worker, minute as epoch ms) over [start, end): the
    samples' key (worker, metric, GPU, time) is the index this reads."""
    start_ms = int(start.timestamp() * 1000)
    end_ms = int(end.timestamp() * 1000)
    minute = func.floor(MetricSample.ts / 60_000)
    rows = await session.execute(
        select(MetricSample.worker_id, minute, func.avg(MetricSample.value))
        .where(
            MetricSample.worker_id.in_(list(worker_ids)),
            MetricSample.metric == UTILIZATION,
            MetricSample.gpu >= 0,
            MetricSample.ts >= start_ms,
            MetricSample.ts < end_ms,
        )
        .group_by(MetricSample.worker_id, MetricSample.gpu, minute)
    )
    out: dict[tuple[int, int], list[float]] = defaultdict(list)
    for worker_id, at_minute, mean in rows:
        out[(worker_id, int(at_minute) * 60_000)].append(float(mean))
    return out


async def mark_notified(session: AsyncSession, run_id: int, at: datetime) -> bool:
    """Record that the run's workspace was told it idles; False where another check did."""
    done = await session.execute(
        update(Run)
        .where(Run.id == run_id, Run.idle_notified_at.is_(None))
        .values(idle_notified_at=at)
    )
    return bool(done.rowcount)  # type: ignore[attr-defined]


async def clear_notified(session: AsyncSession, run_ids: Sequence[int]) -> None:
    """Runs found busy again: their next idle spell is told too."""
    if run_ids:
        await session.execute(
            update(Run).where(Run.id.in_(list(run_ids))).values(idle_notified_at=None)
        )


def add_action(session: AsyncSession, action: IdleAction) -> None:
    session.add(action)


async def actions_since(
    session: AsyncSession, workspace_ids: Sequence[int], since: datetime
) -> list[IdleAction]:
    """What the workspaces' idle policies did since ``since``, newest first."""
    return list(
        await session.scalars(
            select(IdleAction)
            .where(IdleAction.workspace_id.in_(list(workspace_ids)), IdleAction.at >= since)
            .order_by(IdleAction.at.desc(), IdleAction.id.desc())
        )
    )
