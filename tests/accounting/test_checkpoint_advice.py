"""The checkpoint advice (issue 41) from a run's own reports and its pool's own history: each
checkpoint's cost is the pause in its steps around it, its interval the time between two; the
pool's interruptions per GPU-hour held there give the run's mean time between failures; the
advice is the Young-Daly interval and what it saves, or says honestly what it lacks."""

from __future__ import annotations

from datetime import timedelta

import pytest

from backend.accounting import checkpoint_advice, young_daly
from backend.accounting.checkpoint_advice import CheckpointAdvice
from backend.errors import NotFound
from backend.lifecycle import service as lifecycle
from tests.lifecycle.world import World
from tests.support import FakeClock
from tests.support.accounting import tick

pytestmark = pytest.mark.db

PACE = 1.0  # steps a second
EVERY = 120  # steps between checkpoints
COST = 20.0  # seconds a checkpoint pauses the steps


async def trains(world: World, clock: FakeClock, steps: int, first: int = 0) -> None:
    """Its workload steps at PACE, pausing COST at each checkpoint, its progress read every
    5 s: each report dated when its last step was written."""
    worker = "train-0"
    step, checkpoint, written = first, None, clock.now()
    read = clock.now()
    while step < first + steps:
        step += 1
        written += timedelta(seconds=1 / PACE)
        if step % EVERY == 0:
            written += timedelta(seconds=COST)
            checkpoint = step
        if written - read >= timedelta(seconds=5):
            read = written
            clock.moment = written
            fields = {"step": step, "at": written}
            if checkpoint is not None:
                fields["checkpoint_step"] = checkpoint
            await world.report(worker, "progress", **fields)


async def fails_and_restarts(world: World, clock: FakeClock) -> None:
    clock.advance(seconds=1)
    await world.report("train-0", "exited", exit_code=1)
    clock.advance(seconds=12)  # its restart's wait (10 s)
    assert (await world.schedule()).placed == ["train"]
    await world.start("train-0")


async def advice(world: World, token: str | None = None) -> CheckpointAdvice:
    async with world.db.read() as session:
        return await checkpoint_advice.advice(
            session, world.clock, await world.principal(token), "train"
        )


async def test_the_advice_from_its_checkpoints_and_its_pools_failures(
    world: World, clock: FakeClock
) -> None:
    await world.machine("gpu-07", gpus=8, pool="h100")
    await world.machine("gpu-09", gpus=8, pool="a100")  # another pool's failures do not count
    await world.submit(name="train", workers=1, gpus=2, pool="h100")
    assert (await world.schedule()).placed == ["train"]
    await world.start("train-0")
    found = await advice(world)
    assert (found.checkpoints, found.cost_s, found.sentence) == (
        0,
        None,
        "No checkpoints measured yet: its workload reports checkpoint_step in its progress "
        "file at each checkpoint, a step at a time (two at least)",
    )

    await trains(world, clock, 600)
    for _ in range(2):
        await fails_and_restarts(world, clock)
        await trains(world, clock, 600)
    clock.advance(minutes=2)
    await tick(world)
    found = await advice(world)
    assert found.sentence.startswith("Not enough failures to estimate: 2 in 0.")
    assert found.sentence.endswith("GPU-hours on pool h100 over 30 days (3 needed)")
    # each checkpoint measured, within a report's 5 s of its real pause
    assert found.checkpoints == 15
    assert found.cost_s is not None and abs(found.cost_s - COST) <= 5
    assert found.interval_s == pytest.approx(EVERY / PACE + COST, abs=5)

    await fails_and_restarts(world, clock)
    await trains(world, clock, 600)
    clock.advance(minutes=2)
    await tick(world)
    found = await advice(world)
    assert (found.scope, found.failures, found.failures_by_cause) == ("pool h100", 3, {"exited": 3})
    assert found.gpu_hours > 0 and found.mtbf_s is not None
    assert found.mtbf_s == pytest.approx(3600 * found.gpu_hours / (3 * 2))
    assert found.cost_s is not None and found.interval_s is not None
    told = young_daly.advise(found.interval_s, found.cost_s, found.mtbf_s, 2)
    assert found.optimal_interval_s == pytest.approx(told.optimal_interval_s)
    assert found.gpu_hours_saved_per_week == pytest.approx(told.gpu_hours_saved_per_week)
    shown = checkpoint_advice.seconds_shown
    assert found.sentence.startswith(
        f"Checkpoint every {shown(told.optimal_interval_s)}, not every "
        f"{shown(found.interval_s)} (each checkpoint costs {shown(found.cost_s)}, and a run of 2 "
        f"GPUs on pool h100 is interrupted every {shown(found.mtbf_s)} on average): about "
    ) or found.sentence.startswith(f"Checkpointing every {shown(found.interval_s)} is about")


async def test_checkpoints_are_kept_30_days(world: World, clock: FakeClock) -> None:
    await world.machine("gpu-07", gpus=8)
    await world.submit(name="train", workers=1, gpus=2)
    assert (await world.schedule()).placed == ["train"]
    await world.start("train-0")
    await trains(world, clock, 600)
    assert (await advice(world)).checkpoints == 5
    clock.advance(days=30, seconds=1)
    await trains(world, clock, 240, first=600)  # two more, now
    async with world.db.transaction() as session:
        assert await lifecycle.prune_checkpoints(session, clock) == 5
    assert (await advice(world)).checkpoints == 2


async def test_another_workspaces_run_has_no_advice_for_it(world: World) -> None:
    await world.machine("gpu-07", gpus=8)
    await world.submit(name="train", workers=1, gpus=2)
    for token in (world.tenancy.other_token, world.tenancy.foreign_token):
        with pytest.raises(NotFound):
            await advice(world, token)


def test_durations_as_people_say_them() -> None:
    shown = checkpoint_advice.seconds_shown
    assert [shown(s) for s in (0.284, 9.9, 42, 59.6, 60, 754, 3_900, 90_000)] == [
        "0.3 s",
        "9.9 s",
        "42 s",
        "1 min",
        "1 min",
        "13 min",
        "1 h 5 min",
        "1 d 1 h",
    ]
