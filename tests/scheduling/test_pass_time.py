"""A scheduling pass reads its clock before it reads what it places. A run submitted in the
meantime took its own time a moment later (in another process, maybe on another host) and was
committed before the pass read it. Placed at the pass's time, it held GPUs from before it
existed, and its ledger counted that time: 24 ms of GPU time over its held time, found by the
production topology's conservation check under the load of 8 test lanes (2026-12-05). Its
placement is dated no earlier than its submission."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.lifecycle.world import World
from tests.support import FakeClock
from tests.support.accounting import counted_until, run_gpu_seconds, tick

pytestmark = pytest.mark.db

BEHIND = timedelta(milliseconds=12)  # how long before the submission the pass read its clock


async def test_a_run_submitted_after_the_pass_read_its_clock_holds_nothing_before_it(
    world: World, clock: FakeClock
) -> None:
    await world.machine("gpu-07", gpus=2)
    clock.advance(seconds=20.5)
    run = await world.submit(name="steady", workers=1, gpus=2)
    submitted = clock.now()
    clock.advance(seconds=-BEHIND.total_seconds())  # the pass's clock, read before
    result = await world.schedule()
    assert result.placed == ["steady"], result.reasons

    phases = await world.phases("steady-0")
    assert [state for _, state, _, _ in phases] == ["Pending", "Starting"]
    assert all(at >= submitted for at, *_ in phases), phases

    clock.advance(minutes=2)
    await world.start("steady-0")
    clock.advance(minutes=1)
    await tick(world)
    mark = await counted_until(world)
    counted = await run_gpu_seconds(world, run.id)
    # every second from its submission to the mark, once, times its 2 GPUs
    assert counted == pytest.approx(2 * (mark - submitted).total_seconds(), abs=1e-6)
