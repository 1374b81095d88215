"""The seed's goodput table, reproduced in shape by a real week of two runs (compressed to
minutes): llm stalls, fails, restarts; sweep-7 waits, idles, is preempted by a drain.

    RUN      HELD  USED GOODPUT IDLE STALLED START RESTART FAILURE PREEMPT WAITING
    llm     323.1 300.1   93%    0.0   6.2    2.1    4.1    12.7    0.0     0.0
    sweep-7 146.5 112.4   77%   21.0   0.0    7.7    0.0     0.0    3.3    18.0
    TOTAL   469.6 412.5   88%   21.0   6.2    9.8    4.1    12.7    3.3    18.0

Every column of every row is checked against the ledger it comes from, and every row adds up
(DESIGN §4: HELD = USED + IDLE + STALLED + START + RESTART + FAILURE + PREEMPT).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select

from backend.db import Database
from backend.machines import service as machines
from backend.models import Machine, Worker
from tests.accounting.test_tick import sample, tick
from tests.lifecycle.world import World
from tests.support import SEED_TIME, FakeClock, Tenancy

COLUMNS = ("HELD", "USED", "IDLE", "STALLED", "START", "RESTART", "FAILURE", "PREEMPT", "WAITING")


def columns(ledger: dict[str, Any]) -> dict[str, float]:
    """A ledger as the seed's table shows it (GPU-hours)."""
    held = ledger["held_gpu_hours"]
    return {
        "HELD": ledger["allocated_gpu_hours"],
        "USED": ledger["productive_gpu_hours"],
        "IDLE": held["idle"],
        "STALLED": held["stalled"],
        "START": held["starting"],
        "RESTART": held["restart"],
        "FAILURE": held["failure"],
        "PREEMPT": held["preemption"],
        "WAITING": ledger["waiting_gpu_hours"],
    }


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


@pytest.fixture
async def world(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    return World(db, clock, tenancy)


async def test_a_week_of_llm_and_sweep_7_has_the_seeds_shape(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # seed G-24 (the table's columns and TOTAL row), G-1 … G-15 (each category)
    await world.machine("gpu-07")
    await world.submit(
        name="llm", workers=2, gpus=4, priority=90, stall_timeout="3m", on_stall="keep"
    )
    await world.submit(name="sweep-7", workers=1, gpus=8, priority=10)  # waits: no room
    await world.schedule()
    await minutes(world, 2, {})  # llm starting (its barrier)
    await world.start("llm-0", "llm-1")
    await minutes(world, 20, {"llm-0": 0.9, "llm-1": 0.9})  # llm used
    await world.machine("gpu-08")  # room for sweep-7 at last
    await world.schedule()
    await minutes(world, 1, {"llm-0": 0.9, "llm-1": 0.9})  # sweep-7 starting
    await world.start("sweep-7-0")
    # llm-1 goes quiet: stalled from its last progress (found three minutes later), then on
    await minutes(world, 5, {"llm-0": 0.9, "llm-1": 0.9, "sweep-7-0": 0.9}, quiet=("llm-1",))
    await minutes(world, 10, {"llm-0": 0.9, "llm-1": 0.9, "sweep-7-0": 0.9})
    await minutes(world, 10, {"llm-0": 0.9, "llm-1": 0.9, "sweep-7-0": 0.0})  # sweep-7 idles
    # llm-1 fails: llm-0 is stopped with it (failure, held), the gang waits 10 s, restarts
    await world.report("llm-1", "exited", exit_code=1, reason="Exited with code 1")
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

    answer = await client.get(
        "/v1/goodput",
        params={"by": "run", "start": SEED_TIME.isoformat()},
        headers={"Authorization": f"Bearer {tenancy.member_token}"},
    )
    body = answer.json()
    table = {r["name"]: columns(r) for r in body["ledgers"]}
    total = columns(body["total"])
    assert list(table) == ["llm", "sweep-7"]
    llm, sweep = table["llm"], table["sweep-7"]
    # The seed's shape: which columns are empty and which are not, row by row.
    # llm's IDLE: its ranks' first seconds after the restart, before its first sample of that
    # minute; 0.0 at the table's precision in the seed.
    assert llm["IDLE"] < 0.01 * llm["HELD"]
    assert [c for c in COLUMNS if llm[c] > 0.001 and c != "IDLE"] == [
        "HELD",
        "USED",
        "STALLED",
        "START",
        "RESTART",
        "FAILURE",
        "WAITING",
    ]  # its WAITING: the 10 s before the restart, 0.0 at the table's precision in the seed
    assert llm["WAITING"] < 0.05 * llm["HELD"]
    assert [c for c in COLUMNS if sweep[c] > 0.001] == [
        "HELD",
        "USED",
        "IDLE",
        "START",
        "PREEMPT",
        "WAITING",
    ]
    for row in (llm, sweep, total):
        parts = ("USED", "IDLE", "STALLED", "START", "RESTART", "FAILURE", "PREEMPT")
        assert row["HELD"] == pytest.approx(sum(row[c] for c in parts))
    for column in COLUMNS:  # the TOTAL row
        assert total[column] == pytest.approx(llm[column] + sweep[column])
    for ledger, row in (
        (body["ledgers"][0], llm),
        (body["ledgers"][1], sweep),
        (body["total"], total),
    ):
        assert ledger["goodput"] == pytest.approx(row["USED"] / row["HELD"])
    # Exact figures where the scenario fixes them: llm's barrier, 2 minutes of 8 GPUs less the
    # part of the first minute before it was placed; sweep-7's drain, 30 s of 8 GPUs.
    assert sweep["PREEMPT"] == pytest.approx(8 * 30 / 3600)
    assert llm["FAILURE"] == pytest.approx(4 * 40 / 3600)  # llm-0 stopped with the gang
