"""The queue through the scheduling pass, on the database (issue 36): a run pinned to a pool with
no live machine holds up no run of another pool; a run in its restart wait keeps its place and
its room against runs of the same or a lower priority, and its wait is counted as the seed's
table says (failure, not held: "waiting to be placed again after a failure").

Seed L-61, L-62: the reasons are the seed's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from backend.machines import service as machines
from backend.models import Machine, Run
from backend.scheduling import service as scheduling
from tests.lifecycle.world import LEASE, World
from tests.support.accounting import all_intervals, tick

RESTARTING = (
    "Restarting in 10s (1/3): Worker llama-0 failed on gpu-07: Exited with code 1; the gang "
    "does not run without it"
)


async def machine_states(world: World) -> dict[str, str]:
    async with world.db.read() as session:
        return {m.name: m.state for m in await session.scalars(select(Machine))}


async def test_a_run_pinned_to_a_pool_whose_machine_was_lost_holds_nobody_up(
    world: World,
) -> None:
    # issue 36: "every later run with no pool showed 'Pending — Queued behind <that run>' and
    # did not start though machines were free"
    await world.machine("far-1", gpus=8, pool="far")
    world.clock.advance(seconds=LEASE.total_seconds() + 1)
    await world.machine("gpu-07", gpus=8, pool="near")
    async with world.db.transaction() as session:
        await machines.expire_leases(session, world.clock, LEASE)
    assert await machine_states(world) == {"far-1": "lost", "gpu-07": "ready"}
    await world.submit(name="pinned", workers=1, gpus=4, pool="far", priority=90)
    await world.submit(name="anywhere", workers=1, gpus=4)
    await world.submit(name="near", workers=1, gpus=4, pool="near")
    result = await world.schedule()
    assert sorted(result.placed) == ["anywhere", "near"]
    assert result.reasons == {"pinned": "No machine fits: pool far of local has no ready machine"}
    assert await world.status("pinned") == (
        "Pending",
        "No machine fits: pool far of local has no ready machine",
    )
    assert (await world.run("pinned")).waits_for == "machines"


async def failed_once(world: World) -> datetime:
    """llama (8 GPUs, gpu-07's all) ran a minute and failed: in its restart wait, as of when."""
    await world.machine("gpu-07", gpus=8)
    await world.submit(name="llama", workers=1, gpus=8, max_restarts=3)
    assert (await world.schedule()).placed == ["llama"]
    await world.start("llama-0")
    world.clock.advance(minutes=1)
    await world.report("llama-0", "exited", exit_code=1)
    assert await world.status("llama") == ("Pending", RESTARTING)
    return world.clock.now()


async def test_a_run_in_its_restart_wait_is_not_overtaken_by_the_same_or_a_lower_priority(
    world: World,
) -> None:
    # issue 36: "During the restart backoff another run took its machines ... and the run fell
    # to the back of the queue"
    failed = await failed_once(world)
    await world.submit(name="later", workers=1, gpus=8)
    await world.submit(name="lower", workers=1, gpus=2, priority=10)
    during = await world.schedule()
    assert during.placed == []
    assert during.reasons == {"later": "Queued behind llama", "lower": "Queued behind later"}
    # its own sentence stays: it says when it restarts
    assert await world.status("llama") == ("Pending", RESTARTING)
    assert (await world.run("later")).waits_for == "queue"

    world.clock.advance(seconds=10)
    over = await world.schedule()
    assert over.placed == ["llama"]
    assert over.reasons == {
        "later": "No machine fits: none has room now for a worker of 8 GPUs, 4 cores, 16 GiB"
        " (GPUs short on gpu-07)",
        "lower": "Queued behind later",
    }
    assert [h[1:] for h in await world.history("llama")][-2:] == [
        ("Pending", RESTARTING),
        ("Starting", "Starting together: 0 of 1 ready"),
    ]
    assert (await world.history("llama"))[-1][0] == failed + timedelta(seconds=10)


async def test_its_wait_is_failure_not_held_and_the_later_runs_wait_is_waiting(
    world: World,
) -> None:
    # DESIGN §4 / seed goodput: failure is "held while placed": the 10 s of its restart wait
    # are failure, held by no one (its GPUs were kept free for it); the run queued behind it
    # waits for its first placement (waiting, not held)
    failed = await failed_once(world)
    await world.submit(name="later", workers=1, gpus=8)
    later_at = world.clock.now()
    await world.schedule()
    world.clock.advance(seconds=10)
    assert (await world.schedule()).placed == ["llama"]
    world.clock.advance(minutes=2)
    await tick(world)
    intervals = {
        (i.worker_name, i.start_at): (i.category, i.held, i.gpus, i.end_at)
        for i in await all_intervals(world)
    }
    restarted = failed + timedelta(seconds=10)
    assert intervals[("llama-0", failed)] == ("failure", False, 8, restarted)
    assert intervals[("later-0", later_at)][:3] == ("waiting", False, 8)


async def test_a_run_of_higher_priority_still_takes_the_room_of_one_in_its_restart_wait(
    world: World,
) -> None:
    # DESIGN §3: priority order; the restart wait keeps a place in the queue, not a machine
    await failed_once(world)
    await world.submit(name="urgent", workers=1, gpus=8, priority=90)
    await world.submit(name="later", workers=1, gpus=2)
    during = await world.schedule()
    assert during.placed == ["urgent"]
    # without room kept for it, it claims gpu-07 as a run waiting for room: none passes it
    assert during.reasons == {"later": "Queued behind llama"}
    world.clock.advance(seconds=10)
    over = await world.schedule()
    assert over.placed == []
    assert over.reasons == {
        "llama": "No machine fits: none has room now for a worker of 8 GPUs, 4 cores, 16 GiB"
        " (GPUs short on gpu-07)",
        "later": "Queued behind llama",
    }


async def test_the_room_of_a_gang_winding_down_to_restart_is_kept_for_it(world: World) -> None:
    # issue 36: rank 1 failed and let its GPUs go while rank 0 wound down: a later run of the
    # same priority took them, before the gang's restart wait had even begun
    await world.machine("gpu-07", gpus=8)
    await world.submit(name="pair", workers=2, gpus=4, max_restarts=3)
    await world.schedule()
    await world.start("pair-0", "pair-1")
    world.clock.advance(minutes=1)
    await world.report("pair-1", "exited", exit_code=1)
    assert [w.state for w in await world.workers("pair")] == ["Stopping", "Failed"]
    await world.submit(name="later", workers=1, gpus=4)
    during = await world.schedule()
    assert (during.placed, during.reasons) == ([], {"later": "Queued behind pair"})
    # read a pending reason: the gang's whole, not the workers it let go
    async with world.db.read() as session:
        run = await session.scalar(select(Run).where(Run.name == "pair"))
        assert run is not None
        principal = await world.principal()
        reasons = await scheduling.pending_reasons(session, world.clock, principal, run)
    assert reasons == [("gpu-07", "room for 1 of its 2 workers")]
    world.clock.advance(seconds=3)
    await world.report("pair-0", "exited", exit_code=143)
    assert (await world.run("pair")).reason.startswith("Restarting in 10s (1/3): ")
    assert (await world.schedule()).reasons == {"later": "Queued behind pair"}
    world.clock.advance(seconds=10)
    assert (await world.schedule()).placed == ["pair"]


async def test_a_gang_winding_down_that_will_not_restart_keeps_nothing(world: World) -> None:
    await world.machine("gpu-07", gpus=8)
    await world.submit(name="pair", workers=2, gpus=4, restart_policy="never")
    await world.schedule()
    await world.start("pair-0", "pair-1")
    await world.report("pair-1", "exited", exit_code=1)
    await world.submit(name="later", workers=1, gpus=4)
    assert (await world.schedule()).placed == ["later"]
