"""Terminal states are terminal (issue 19): a worker that failed takes no further transition of
its attempt, a gang stop that races its exit is ordered by when each happened, and the goodput
tick counts an ended worker no more."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from backend.accounting import counting
from backend.errors import Conflict
from backend.lifecycle.gangs import load_gang, persist
from backend.lifecycle.states import (
    COMPLETED,
    FAILED,
    PENDING,
    PLACED_STATES,
    RUNNING,
    STOPPED,
    STOPPING,
    may_follow,
)
from backend.lifecycle.stops import stop
from backend.lifecycle.views import Effects, RunPolicy, RunView, WorkerView, set_worker
from backend.models import GoodputHour, GoodputInterval, GoodputOpenInterval, Worker
from tests.lifecycle.world import World
from tests.support import SEED_TIME

T0 = SEED_TIME


async def tick(world: World) -> None:
    async with world.db.transaction() as session:
        await counting.tick(session, world.clock)


async def counted(world: World, worker: str) -> tuple[float, float, int]:
    """A worker's GPU-seconds in the run ledgers, in its intervals, and its open intervals."""
    async with world.db.read() as session:
        worker_id = await session.scalar(select(Worker.id).where(Worker.name == worker))
        run_id = await session.scalar(select(Worker.run_id).where(Worker.name == worker))
        hours = await session.scalars(
            select(GoodputHour).where(GoodputHour.scope == "run", GoodputHour.scope_id == run_id)
        )
        ledger = sum(h.gpu_seconds for h in hours)
        closed = list(
            await session.scalars(
                select(GoodputInterval).where(GoodputInterval.worker_id == worker_id)
            )
        )
        opened = list(
            await session.scalars(
                select(GoodputOpenInterval).where(GoodputOpenInterval.worker_id == worker_id)
            )
        )
    seconds = sum((i.end_at - i.start_at).total_seconds() * i.gpus for i in closed)
    return ledger, seconds, len(opened)


async def test_a_gang_stop_recorded_before_a_late_earlier_exit_is_not_counted_forever(
    world: World,
) -> None:
    # b-068: rank 1's exit (at +.376) is reported first and stops the gang, so rank 0 is
    # recorded Stopping at +.376; rank 0's own exit, at +.246, is reported after it.
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(gpus=8, restart_policy="never")
    world.clock.advance(seconds=1)
    await world.schedule()  # placed at T0+1s
    world.clock.advance(seconds=1)
    await world.start("llama-sft-0", "llama-sft-1")  # running at T0+2s
    failed_at = T0 + timedelta(seconds=30.246)
    stopped_at = T0 + timedelta(seconds=30.376)
    world.clock.moment = T0 + timedelta(seconds=30.4)
    await world.report("llama-sft-1", "exited", at=stopped_at, exit_code=1, attempt=1)
    await world.report("llama-sft-0", "exited", at=failed_at, exit_code=1, attempt=1)
    workers = {w.name: w for w in await world.workers("llama-sft")}
    assert workers["llama-sft-0"].state == "Failed"
    assert (await world.run("llama-sft")).state == "Failed"
    # Ticks for ten minutes: rank 0 counted from T0 to its exit, no further.
    for _ in range(10):
        world.clock.advance(minutes=1)
        await tick(world)
    ledger, seconds, still_open = await counted(world, "llama-sft-0")
    held = (failed_at - T0).total_seconds() * 8  # waited 1 s (not held), then held until exit
    assert still_open == 0
    assert round(seconds, 3) == round(held, 3)
    _, seconds_1, open_1 = await counted(world, "llama-sft-1")
    assert open_1 == 0
    assert round(seconds_1, 3) == round((stopped_at - T0).total_seconds() * 8, 3)
    # the run ledger holds both workers, each once
    assert round(ledger, 3) == round(held + seconds_1, 3)
    # and another ten minutes change nothing
    for _ in range(10):
        world.clock.advance(minutes=1)
        await tick(world)
    assert await counted(world, "llama-sft-0") == (ledger, seconds, 0)


def test_an_ended_worker_takes_no_further_transition_of_its_attempt() -> None:
    for ended in (COMPLETED, FAILED, STOPPED):
        for state in PLACED_STATES:
            assert not may_follow(ended, state)
            assert may_follow(ended, state, placing=True)  # a new attempt starts afresh
        assert may_follow(ended, PENDING)  # waiting to be placed again
        assert may_follow(ended, ended)  # its run ends: its phase becomes ended
    assert may_follow(RUNNING, STOPPING) and may_follow(STOPPING, FAILED)


def test_a_rule_that_would_move_an_ended_worker_records_nothing() -> None:
    w = WorkerView(
        id=1,
        rank=0,
        name="b-068-0",
        gpus=8,
        state=FAILED,
        reason="Exited with code 1",
        phase="ended",
        attempt=1,
    )
    other = WorkerView(
        id=2,
        rank=1,
        name="b-068-1",
        gpus=8,
        state=RUNNING,
        reason="Container running",
        phase="running",
        machine_id=5,
        machine_name="gpu-05",
        attempt=1,
    )
    run = RunView(
        id=1,
        name="b-068",
        state=RUNNING,
        reason="",
        policy=RunPolicy(),
        workers=[w, other],
        attempt=1,
    )
    fx = Effects()
    set_worker(fx, run, w, STOPPING, "Stopping: worker b-068-1 failed", "stopping:failure", T0)
    assert (w.state, w.phase, fx.transitions) == (FAILED, "ended", [])


async def test_the_database_refuses_to_move_a_worker_whose_attempt_ended_meanwhile(
    world: World,
) -> None:
    # Two writers that both saw llama-sft-0 running: the first wrote it Failed; the second,
    # from what it read, asks it to stop. The conditional write refuses, nothing changes.
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(gpus=8, restart_policy="never")
    world.clock.advance(seconds=1)
    await world.schedule()
    world.clock.advance(seconds=1)
    await world.start("llama-sft-0", "llama-sft-1")
    before = await world.phases("llama-sft-0")
    with pytest.raises(Conflict) as refused:
        async with world.db.transaction() as session:
            gang = await load_gang(session, (await world.run("llama-sft")).id)
            await session.execute(
                update(Worker)
                .where(Worker.name == "llama-sft-0")
                .values(state=FAILED)
                .execution_options(synchronize_session=False)
            )
            fx = Effects()
            stop(gang.view, "ana", world.clock.now(), fx)
            await persist(session, gang, fx, world.clock.now())
    assert refused.value.code == "WORKER_ENDED"
    assert await world.phases("llama-sft-0") == before
    assert [w.state for w in await world.workers("llama-sft")] == [RUNNING, RUNNING]
