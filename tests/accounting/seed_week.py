"""A week of two runs in the shape of the seed's goodput table (compressed to minutes):
llm stalls, fails and restarts; sweep-7 waits, idles and is preempted by a drain.

    RUN      HELD  USED GOODPUT IDLE STALLED START RESTART FAILURE PREEMPT WAITING
    llm     323.1 300.1   93%    0.0   6.2    2.1    4.1    12.7    0.0     0.0
    sweep-7 146.5 112.4   77%   21.0   0.0    7.7    0.0     0.0    3.3    18.0

Played through the real services on a fake clock: the REST test checks every column, the CLI
test prints it from a live server.
"""

from __future__ import annotations

from sqlalchemy import select

from backend.machines import service as machines
from backend.models import Machine, Worker
from tests.lifecycle.world import World
from tests.support.accounting import sample, tick


async def minutes(
    world: World, count: int, busy: dict[str, float], quiet: tuple[str, ...] = ()
) -> None:
    """Let ``count`` minutes pass: samples, progress (of the busy ranks but the quiet ones,
    which keep their GPUs busy and make no progress: a hang), timers, ticks."""
    for _ in range(count):
        await sample(world, busy)  # each minute sampled from its start
        world.clock.advance(minutes=1)
        async with world.db.read() as session:
            running = list(await session.scalars(select(Worker).where(Worker.state == "Running")))
        for w in running:
            if busy.get(w.name, 0.0) > 0 and w.name not in quiet:
                await world.report(w.name, "progress", step=int(world.clock.now().timestamp()))
        await world.timers()
        await tick(world)


async def play_seed_week(world: World) -> None:
    """Both runs from submission; at the end llm is running and sweep-7 waits to be placed."""
    await world.machine("gpu-07", pool="h100")
    await world.submit(
        name="llm", workers=2, gpus=4, priority=90, stall_timeout="3m", on_stall="keep"
    )
    await world.submit(name="sweep-7", workers=1, gpus=8, priority=10)  # waits: no room
    await world.schedule()
    await minutes(world, 2, {})  # llm starting (its barrier)
    await world.start("llm-0", "llm-1")
    await minutes(world, 20, {"llm-0": 0.9, "llm-1": 0.9})  # llm used
    await world.machine("gpu-08", pool="h100")  # room for sweep-7 at last
    await world.schedule()
    await minutes(world, 1, {"llm-0": 0.9, "llm-1": 0.9})  # sweep-7 starting
    await world.start("sweep-7-0")
    # llm-1 goes quiet: stalled from its last progress (found three minutes later), then on
    await minutes(world, 5, {"llm-0": 0.9, "llm-1": 0.9, "sweep-7-0": 0.9}, quiet=("llm-1",))
    await minutes(world, 10, {"llm-0": 0.9, "llm-1": 0.9, "sweep-7-0": 0.9})
    await minutes(world, 10, {"llm-0": 0.9, "llm-1": 0.9, "sweep-7-0": 0.0})  # sweep-7 idles
    # llm-1 fails: llm-0 is stopped with it (failure, held), the gang waits 10 s, restarts
    await world.report("llm-1", "exited", exit_code=1)
    world.clock.advance(seconds=40)
    await world.report("llm-0", "exited", exit_code=143)
    world.clock.advance(seconds=10)
    await world.schedule()
    await minutes(world, 1, {"sweep-7-0": 0.9})  # llm restarting (its barrier again)
    await world.start("llm-0", "llm-1")
    await minutes(world, 10, {"llm-0": 0.9, "llm-1": 0.9, "sweep-7-0": 0.9})
    # gpu-08 is drained: sweep-7 stops (preemption, held), then waits to be placed again
    async with world.db.transaction() as session:
        row = await session.scalar(select(Machine).where(Machine.name == "gpu-08"))
        assert row is not None
        await machines.drain(session, world.clock, row)
    world.clock.advance(seconds=30)
    await world.report("sweep-7-0", "exited", exit_code=143)
    await minutes(world, 5, {"llm-0": 0.9, "llm-1": 0.9})
