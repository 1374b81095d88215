"""Every writer of a gang reads its clock before it locks the gang; another writer may change
the gang and commit in between, having read its clock a moment later (another process, maybe
another host). A user's stop or delete, a drain, dated at their own clock, then came before the
start they stop: a worker's history went back in time, and its ledger counted the time between
twice or not at all. Each is dated no earlier than the gang's last recorded change (the
scheduling pass's case is tests/scheduling/test_pass_time.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from sqlalchemy import select

from backend.accounting import counting
from backend.machines import service as machines
from backend.models import Machine
from backend.runs import service as runs
from tests.lifecycle.world import World
from tests.support import FakeClock
from tests.support.accounting import counted_until, run_gpu_seconds, tick

pytestmark = pytest.mark.db

BEHIND = timedelta(milliseconds=12)  # how long before the gang's last change it read its clock


async def _stop(world: World) -> None:
    principal = await world.principal()
    async with world.db.transaction() as session:
        await runs.stop_run(session, world.clock, principal, "steady")


async def _delete(world: World) -> None:
    principal = await world.principal()
    async with world.db.transaction() as session:
        await runs.delete_run(session, world.clock, principal, "steady", ledger=counting)


async def _drain(world: World) -> None:
    async with world.db.transaction() as session:
        machine = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
        assert machine is not None
        await machines.drain(session, world.clock, machine)


@pytest.mark.parametrize(
    "change",
    [_stop, _delete, _drain],
    ids=["a stop", "a deletion", "a drain"],
)
async def test_a_change_whose_clock_was_read_before_the_gangs_last_is_dated_after_it(
    world: World, clock: FakeClock, change: Callable[[World], Awaitable[None]]
) -> None:
    await world.machine("gpu-07", gpus=2)
    run = await world.submit(name="steady", workers=1, gpus=2)
    submitted = clock.now()
    clock.advance(seconds=5)
    assert (await world.schedule()).placed == ["steady"]
    clock.advance(seconds=30)
    await world.start("steady-0")
    running = clock.now()

    clock.advance(seconds=-BEHIND.total_seconds())  # its clock, read before the start's
    await change(world)

    phases = [] if change is _delete else await world.phases("steady-0")
    times = [at for at, *_ in phases]
    assert times == sorted(times), phases
    history = [at for at, _, _ in await world.history("steady")]
    assert history == sorted(history), history
    assert history[-1] >= running

    clock.advance(minutes=2)
    ended = running if change is _delete else clock.now()
    if change is not _delete:
        await world.report("steady-0", "exited", exit_code=0)  # wound down
    clock.advance(minutes=1)
    await tick(world)
    if change is _drain:  # queued again, it waits from its end on
        ended = await counted_until(world)
    # every second from its submission to its end (its deletion, its exit once wound down),
    # once, times its 2 GPUs
    assert await run_gpu_seconds(world, run.id) == pytest.approx(
        2 * (ended - submitted).total_seconds(), abs=1e-6
    )
