"""A worker's progress is never dated before its current state began. A Slurm job queued again
writes on in the same output file, and its node's agent copies the earlier instance's lines for
the new one dated by the file's last write, before the new instance existed: the new worker's
progress went back to then, and the stall found from it was dated before the instance it stopped
(CI, tests/slurm/test_node_agent.py: the second instance's "stalled" came before the first's
"requeued:stall" in the worker's history). The same holds for any report dated in the past:
news of it is news of now. Both paths: the lifecycle's own and the batched reports'."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from sqlalchemy import update

from backend.gateway import service
from backend.gateway.service import ProgressInfo
from backend.lifecycle.progress import worker_progress
from backend.lifecycle.rules import check_timers
from backend.lifecycle.states import RUNNING, Phase
from backend.lifecycle.views import Effects, RunPolicy
from backend.models import Worker
from tests.lifecycle.test_slurm_timers import T0, slurm_run
from tests.lifecycle.world import World

STALE = timedelta(seconds=40)  # how long before the worker began to run its report is dated


def test_the_rule_dates_it_when_the_worker_began_to_run() -> None:
    # a Slurm job's new instance: placed by the import, no progress of its own yet
    run = slurm_run(RUNNING, RunPolicy(stall_timeout=timedelta(minutes=5)), [timedelta(0)])
    (w,) = run.workers
    w.progress_at, w.since = None, T0 + timedelta(minutes=3)
    worker_progress(run, w, T0 + timedelta(minutes=2), Effects())
    assert w.progress_at == T0 + timedelta(minutes=3)
    fx = Effects()
    check_timers(run, T0 + timedelta(minutes=9), fx)
    assert [(t.at, t.phase) for t in fx.transitions if t.worker_id] == [
        (T0 + timedelta(minutes=3), Phase.STALLED)
    ]


async def _running(world: World) -> None:
    """A worker running as a Slurm job's new instance is: no progress yet (external.py clears
    the last instance's as the import places it)."""
    await world.machine("gpu-07", gpus=2)
    await world.submit(name="quiet", workers=1, gpus=2, stall_timeout="5m", on_stall="keep")
    world.clock.advance(seconds=5)
    await world.schedule()
    world.clock.advance(seconds=30)
    await world.start("quiet-0")
    async with world.db.transaction() as session:
        await session.execute(update(Worker).values(progress_at=None, stepped_at=None))


async def _alone(world: World) -> None:
    await world.report("quiet-0", "progress", at=world.clock.now() - STALE)


async def _batched(world: World) -> None:
    (worker,) = await world.workers("quiet")
    assert worker.machine_id is not None
    stale = ProgressInfo(
        worker.machine_id, worker.id, worker.attempt, None, world.clock.now() - STALE
    )
    async with world.db.transaction() as session:
        left = await service.reports(session, world.clock, [stale], [])
    assert left.progress == []  # written there, not left to the lifecycle's path


@pytest.mark.db
@pytest.mark.parametrize("path", [_alone, _batched], ids=["alone", "batched"])
async def test_progress_dated_before_the_worker_ran_counts_from_when_it_ran(
    world: World, path: Callable[[World], Awaitable[None]]
) -> None:
    await _running(world)
    (worker,) = await world.workers("quiet")
    running = worker.state_since
    world.clock.advance(seconds=2)
    await path(world)
    (worker,) = await world.workers("quiet")
    assert worker.progress_at == running

    world.clock.advance(minutes=5)
    await world.timers()
    phases = await world.phases("quiet-0")
    assert [(state, phase) for _, state, phase, _ in phases][-2:] == [
        ("Running", "running"),
        ("Running", "stalled"),
    ]
    times = [at for at, *_ in phases]
    assert times == sorted(times), phases
    assert times[-1] == running  # stalled from its last progress: never before it ran
