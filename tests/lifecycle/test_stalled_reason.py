"""A run whose workers stalled and run on (on_stall: keep) says so in its own reason, which the
CLI's run line, GraphQL's Run.reason and REST's reason all read (issue 36: `astra astraeus status`
said "Running — 2 of 2 workers running" on the run's line, only its worker lines "Stalled")."""

from __future__ import annotations

from datetime import timedelta

from backend.lifecycle.sentences import stalled_sentence, workers_completed, workers_running
from tests.lifecycle.world import World
from tests.support import SEED_TIME
from tests.support.lifecycle import running_gang


def test_the_sentence_names_the_stalled_workers_and_when_the_first_stopped() -> None:
    since = SEED_TIME
    assert stalled_sentence([("llama-sft-1", "gpu-08")], since) == (
        "Worker llama-sft-1 stalled on gpu-08: no progress since 2026-10-01 01:02:11 UTC"
    )
    assert stalled_sentence([("a-0", "m0"), ("a-1", "m1")], since) == (
        "Workers a-0 and a-1 stalled: no progress since 2026-10-01 01:02:11 UTC"
    )
    five = [(f"a-{rank}", "m") for rank in range(5)]
    assert stalled_sentence(five, since) == (
        "Workers a-0, a-1, a-2 and 2 others stalled: no progress since 2026-10-01 01:02:11 UTC"
    )
    assert stalled_sentence(five[:4], since).startswith("Workers a-0, a-1, a-2 and 1 other ")


def test_one_worker_is_one_worker() -> None:
    # issue 36: "1 of 1 workers running"; the seed's "2 of 2 workers running" stays
    assert workers_running(1, 1) == "1 of 1 worker running"
    assert workers_running(2, 2) == "2 of 2 workers running"
    assert workers_running(1, 2) == "1 of 2 workers running"
    assert workers_completed(1) == "1 of 1 worker completed"


async def test_a_run_that_stalls_and_runs_on_says_which_and_since_when(world: World) -> None:
    await running_gang(world, stall_timeout="5m", on_stall="keep")
    world.clock.advance(seconds=30)
    quiet_since = world.clock.now()
    await world.report("llama-sft-0", "progress", step=10)
    await world.report("llama-sft-1", "progress", step=10)
    for _ in range(4):  # rank 0 goes on; rank 1 says nothing more
        world.clock.advance(minutes=1)
        await world.report("llama-sft-0", "progress", step=20)
    world.clock.advance(minutes=2)
    await world.timers()
    when = quiet_since.strftime("%Y-%m-%d %H:%M:%S")
    assert await world.status("llama-sft") == (
        "Running",
        f"Worker llama-sft-1 stalled on gpu-08: no progress since {when} UTC",
    )
    # the run's history has no new state: it runs on (its worker's row says Stalled)
    assert [state for _, state, _ in await world.history("llama-sft")][-1] == "Running"
    assert (await world.workers("llama-sft"))[1].reason == "Stalled: no progress for 5m"

    world.clock.advance(minutes=5)  # rank 0 stalls too: the first one's time stays
    await world.timers()
    assert await world.status("llama-sft") == (
        "Running",
        f"Workers llama-sft-0 and llama-sft-1 stalled: no progress since {when} UTC",
    )
    await world.report("llama-sft-1", "progress", step=11)  # rank 1 comes back
    zero_since = (quiet_since + timedelta(minutes=4)).strftime("%Y-%m-%d %H:%M:%S")
    assert await world.status("llama-sft") == (
        "Running",
        f"Worker llama-sft-0 stalled on gpu-07: no progress since {zero_since} UTC",
    )
    await world.report("llama-sft-0", "progress", step=21)
    assert await world.status("llama-sft") == ("Running", "2 of 2 workers running")
