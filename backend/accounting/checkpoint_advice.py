"""How often a run should checkpoint (issue 41), from what it measured and its cluster's own
history: its checkpoints' cost (the pause in its steps around each) and interval (between its
checkpoints), the mean time between failures of the machines it runs on (the interruptions of
runs on its pool, or its cluster without one, per GPU-hour held there over 30 days, scaled to
its GPUs), and the Young-Daly interval with the GPU-hours a week of running it would save.
Fewer than MIN_FAILURES interruptions say "not enough failures to estimate"."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting import ledger_queries, young_daly
from backend.clock import Clock
from backend.lifecycle.sentences import minutes_shown, restart_backoff
from backend.models import Checkpoint, Machine, Pool, Run, Worker, WorkerFailure
from backend.runs import service as runs

MIN_FAILURES = 3
HISTORY = timedelta(days=30)
# An interval within this share of Young's is about right: the loss curve is flat near it.
ABOUT_RIGHT = 0.2


@dataclass(frozen=True)
class CheckpointAdvice:
    run: str
    gpus: int
    checkpoints: int
    cost_s: float | None
    interval_s: float | None
    scope: str  # where its failures are counted: "pool h100", "cluster local"
    failures: int
    failures_by_cause: dict[str, int] = field(default_factory=dict)
    gpu_hours: float = 0.0
    mtbf_s: float | None = None  # the run's: its GPUs' share of the interruptions
    optimal_interval_s: float | None = None
    gpu_hours_saved_per_week: float | None = None
    sentence: str = ""


def seconds_shown(seconds: float) -> str:
    """``0.3 s``, ``42 s``, ``12 min``, ``1 h 5 min``: a duration as people say it."""
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    if round(seconds) < 60:
        return f"{round(seconds)} s"
    return minutes_shown(timedelta(minutes=round(seconds / 60)))


async def advice(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    name: str,
    workspace: str | None = None,
) -> CheckpointAdvice:
    run = await runs.get_run(session, principal, name, workspace=workspace)
    gpus = run.worker_count * run.gpus_per_worker
    cost, interval, count = await _measured(session, run.id, await _failed_at(session, run.id))
    scope, machines = await _scope(session, run)
    now = clock.now()
    failures, by_cause = await _interruptions(session, machines, now - HISTORY)
    gpu_hours = await _held_gpu_hours(session, machines, now - HISTORY, now)
    found = CheckpointAdvice(
        run.name, gpus, count, cost, interval, scope, failures, by_cause, gpu_hours
    )
    if cost is None or interval is None:
        return _with(
            found,
            sentence="No checkpoints measured yet: its workload reports checkpoint_step in its "
            "progress file at each checkpoint, a step at a time (two at least)",
        )
    if failures < MIN_FAILURES or gpu_hours <= 0 or gpus <= 0:
        return _with(
            found,
            sentence=f"Not enough failures to estimate: {failures} in {gpu_hours:,.1f} "
            f"GPU-hours on {scope} over {HISTORY.days} days ({MIN_FAILURES} needed)",
        )
    mtbf = 3600 * gpu_hours / (failures * gpus)
    told = young_daly.advise(interval, max(cost, 1.0), mtbf, gpus)
    why = (
        f"each checkpoint costs {seconds_shown(cost)}, and a run of {gpus} GPUs on {scope} is "
        f"interrupted every {seconds_shown(mtbf)} on average"
    )
    if abs(interval - told.optimal_interval_s) <= ABOUT_RIGHT * told.optimal_interval_s:
        sentence = (
            f"Checkpointing every {seconds_shown(interval)} is about right (Young-Daly: "
            f"{seconds_shown(told.optimal_interval_s)}; {why})"
        )
    else:
        sentence = (
            f"Checkpoint every {seconds_shown(told.optimal_interval_s)}, not every "
            f"{seconds_shown(interval)} ({why}): about {told.gpu_hours_saved_per_week:,.1f} "
            "GPU-hours saved a week of running"
        )
    return _with(
        found,
        mtbf_s=mtbf,
        optimal_interval_s=told.optimal_interval_s,
        gpu_hours_saved_per_week=told.gpu_hours_saved_per_week,
        sentence=sentence,
    )


def _with(found: CheckpointAdvice, **changes: object) -> CheckpointAdvice:
    return dataclasses.replace(found, **changes)  # type: ignore[arg-type]


async def _failed_at(session: AsyncSession, run_id: int) -> list[datetime]:
    return list(
        await session.scalars(select(WorkerFailure.at).where(WorkerFailure.run_id == run_id))
    )


async def _measured(
    session: AsyncSession, run_id: int, failed: list[datetime]
) -> tuple[float | None, float | None, int]:
    """The median cost of its checkpoints, the median time between two of a worker's (not two
    with a failure of the run between: that is its restart's time too), and how many it
    reported."""
    rows = await session.execute(
        select(Checkpoint.worker_id, Checkpoint.at, Checkpoint.cost_s)
        .where(Checkpoint.run_id == run_id)
        .order_by(Checkpoint.worker_id, Checkpoint.at)
    )
    by_worker: dict[int, list[datetime]] = defaultdict(list)
    costs = []
    count = 0
    for worker_id, at, cost in rows:
        by_worker[worker_id].append(at)
        count += 1
        if cost is not None:
            costs.append(cost)
    gaps = [
        (b - a).total_seconds()
        for times in by_worker.values()
        for a, b in itertools.pairwise(times)
        if b > a and not any(a <= f <= b for f in failed)
    ]
    cost = statistics.median(costs) if costs else None
    return cost, statistics.median(gaps) if gaps else None, count


async def _scope(session: AsyncSession, run: Run) -> tuple[str, list[int]]:
    """Where its failures are counted: the pool it names or runs on, else its cluster."""
    pool_ids = set(
        await session.scalars(
            select(Machine.pool_id)
            .join(Worker, Worker.machine_id == Machine.id)
            .where(Worker.run_id == run.id, Machine.pool_id.is_not(None))
        )
    )
    named = (run.spec or {}).get("pool")
    pool = None
    if named:
        pool = await session.scalar(
            select(Pool).where(Pool.cluster_id == run.cluster_id, Pool.name == named)
        )
    elif len(pool_ids) == 1:
        pool = await session.get(Pool, next(iter(pool_ids)))
    if pool is not None:
        machines = await session.scalars(select(Machine.id).where(Machine.pool_id == pool.id))
        return f"pool {pool.name}", list(machines)
    machines = await session.scalars(select(Machine.id).where(Machine.cluster_id == run.cluster_id))
    cluster = (run.spec or {}).get("cluster") or "its cluster"
    return f"cluster {cluster}", list(machines)


async def _interruptions(
    session: AsyncSession, machines: list[int], since: datetime
) -> tuple[int, dict[str, int]]:
    """The runs' interruptions on the machines since then, by cause: a run's failures less than
    a restart's least wait apart (its gang's workers failing together, a machine lost with
    several) count once; two apart by more are two, each restarted in between."""
    if not machines:
        return 0, {}
    rows = await session.execute(
        select(WorkerFailure.run_id, WorkerFailure.at, WorkerFailure.cause)
        .where(WorkerFailure.machine_id.in_(machines), WorkerFailure.at >= since)
        .order_by(WorkerFailure.at)
    )
    last: dict[int, datetime] = {}
    causes: Counter[str] = Counter()
    for run_id, at, cause in rows:
        before = last.get(run_id)
        if before is None or at - before >= restart_backoff(1):
            last[run_id] = at
            causes[cause] += 1
    return sum(causes.values()), dict(causes)


async def _held_gpu_hours(
    session: AsyncSession, machines: list[int], start: datetime, end: datetime
) -> float:
    """The GPU-hours held on the machines over the period, every workspace's."""
    if not machines:
        return 0.0
    sums = await ledger_queries.hour_sums(session, "machine", start, end, scope_ids=machines)
    return sum(seconds for _, _, held, seconds in sums if held) / 3600
