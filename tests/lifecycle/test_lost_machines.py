"""A lost machine is dated when it went silent, not when it was noticed (issue 36; seed G-10,
L-21, L-55): its workers fail at its last contact, every rank with its failure snapshot (the
last lines the server relayed of it, none if none came), lost and still holding their GPUs
until the loss is found; the minutes already counted since are taken back and counted as
failure. Each ledger is written out by hand, second by second, from the times below. On SQLite
and PostgreSQL (the db fixture), under a fake clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from backend.clock import iso_offset
from backend.db import Database
from backend.lifecycle import service as lifecycle
from backend.machines import service as machines
from backend.models import Machine, Run
from tests.lifecycle.world import LEASE, World
from tests.support import FakeClock, Tenancy
from tests.support.accounting import ledger, sample, tick

LOST = "Machine lost: its lease expired"


@pytest.fixture
async def world(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    world = World(db, clock, tenancy)
    clock.advance(seconds=60 - clock.now().second, microseconds=-clock.now().microsecond)
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await tick(world)  # the mark: counted from this minute on
    return world


def at(world: World, start: datetime, seconds: float) -> None:
    """The clock at ``seconds`` after ``start``."""
    world.clock.advance(
        seconds=(start + timedelta(seconds=seconds) - world.clock.now()).total_seconds()
    )


async def heard(world: World, *names: str) -> None:
    """The machines' agents are heard from now (a heartbeat)."""
    async with world.db.transaction() as session:
        for m in await session.scalars(select(Machine).where(Machine.name.in_(names))):
            await machines.heartbeat(session, world.clock, m.id, LEASE)


async def check_leases(world: World) -> None:
    async with world.db.transaction() as session:
        await machines.expire_leases(session, world.clock, LEASE)


async def gang(world: World, machines_: int, **spec: Any) -> datetime:
    """llama-sft, two ranks (on one machine, 4 GPUs each, or on two, 8 each), running 5 s
    after it was placed, their GPUs busy; when it was placed (a minute's start)."""
    gpus = 4 if machines_ == 1 else 8
    await world.submit(workers=2, gpus=gpus, **spec)
    start = world.clock.now()
    await world.schedule()
    placed = {w.machine_id for w in await world.workers("llama-sft")}
    assert len(placed) == machines_
    at(world, start, 5)
    await world.start("llama-sft-0", "llama-sft-1")
    at(world, start, 30)
    await sample(world, {0: 0.9, 1: 0.9})
    return start


def snapshot(failed_at: datetime, log_tail: str = "") -> dict[str, Any]:
    return {
        "reason": LOST,
        "failed_at": iso_offset(failed_at),
        "exit_code": None,
        "log_tail": log_tail,
    }


async def test_both_ranks_fail_at_the_last_contact_and_the_time_since_is_failure(
    world: World,
) -> None:
    # seed G-10: "failed or lost and still holding its GPUs"; L-21, L-55
    start = await gang(world, machines_=1)
    at(world, start, 40)
    await heard(world, "gpu-07", "gpu-08")  # gpu-07's last contact
    at(world, start, 61)
    await tick(world)  # the minute counted as gpu-07's agent last said: running, busy
    assert await ledger(world) == {("starting", True): 8 * 5, ("productive", True): 8 * 55}
    at(world, start, 101)
    await heard(world, "gpu-08")
    at(world, start, 105)  # gpu-07's lease (from 40 s) expired at 100 s
    await check_leases(world)

    silent, found = start + timedelta(seconds=40), start + timedelta(seconds=105)
    reason = (
        f"Restarting in 10s (1/10): Worker llama-sft-0 failed on gpu-07: {LOST}; the gang does "
        "not run without it"
    )
    for worker in await world.workers("llama-sft"):
        assert (worker.state, worker.reason, worker.exit_code) == (
            "Pending",
            f"Waiting to be placed again: {reason}",
            None,
        )
        assert worker.last_failure == snapshot(silent)
        assert (worker.restarts, worker.restart_at) == (1, found + timedelta(seconds=10))
    run = await world.run("llama-sft")
    assert (run.state, run.reason, run.restart_at) == (
        "Pending",
        reason,
        found + timedelta(seconds=10),
    )
    assert (await world.phases("llama-sft-0"))[-3:] == [
        (silent, "Failed", "stopping:failure", 4),  # lost, still holding its GPUs
        (found, "Failed", "requeued:failure", 0),  # let go once the loss is found
        (found, "Pending", "requeued:failure", 0),
    ]
    assert (await world.phases("llama-sft-1"))[-4:] == [
        (silent, "Stopping", "stopping:failure", 4),  # its gang's failure: the same moment
        (silent, "Failed", "stopping:failure", 4),  # and its own, of the same loss
        (found, "Failed", "requeued:failure", 0),
        (found, "Pending", "requeued:failure", 0),
    ]

    at(world, start, 121)
    await tick(world)  # counts on, and takes back the 20 s counted busy after the last contact
    by_hand = {
        ("starting", True): 2 * 4 * 5,  # placed 0 s, running 5 s
        ("productive", True): 2 * 4 * 35,  # 5 s to its last contact at 40 s
        ("failure", True): 2 * 4 * 65,  # lost, holding its GPUs: 40 s to 105 s
        ("failure", False): 2 * 4 * 15,  # waiting to be placed again: 105 s to 120 s
    }
    assert await ledger(world) == by_hand
    assert await ledger(world, "machine") == {
        k: v for k, v in by_hand.items() if k[1]
    }  # the machine held its GPUs: none else could have them


async def test_a_rank_that_heard_of_its_lost_peer_is_not_the_first_failure(world: World) -> None:
    # rank 1 on gpu-08 exits of its lost peer 10 s after gpu-07 went silent, before the loss is
    # found: the first failure is rank 0's, dated at the last contact (issue 20's grace)
    start = await gang(world, machines_=2)
    at(world, start, 40)
    await heard(world, "gpu-07", "gpu-08")
    at(world, start, 50)
    await world.report(
        "llama-sft-1", "exited", exit_code=1, log_tail="RuntimeError: Connection closed by peer\n"
    )
    at(world, start, 101)
    await heard(world, "gpu-08")
    at(world, start, 105)
    await check_leases(world)

    lost, heard_of_it = await world.workers("llama-sft")
    silent = start + timedelta(seconds=40)
    assert lost.last_failure == snapshot(silent)
    assert heard_of_it.last_failure["reason"] == "Exited with code 1"
    assert (await world.run("llama-sft")).reason.startswith(
        f"Restarting in 10s (1/10): Worker llama-sft-0 failed on gpu-07: {LOST}"
    )
    at(world, start, 121)
    await tick(world)
    assert await ledger(world) == {
        ("starting", True): 2 * 8 * 5,
        ("productive", True): 8 * 35 + 8 * 45,  # rank 1 ran until it exited at 50 s
        ("failure", True): 8 * 65,  # rank 0, lost: 40 s to 105 s
        ("failure", False): 8 * 15 + 8 * 70,  # after: rank 0 from 105 s, rank 1 from 50 s
    }


async def test_a_stop_asked_after_the_machine_went_silent_never_reached_it(world: World) -> None:
    # its owner stops the run at 50 s: gpu-07 was lost at 40 s, its workers failed then (their
    # stop was never wound down: not productive), and the run ends Stopped
    start = await gang(world, machines_=1, restart_policy="never")
    at(world, start, 40)
    await heard(world, "gpu-07", "gpu-08")
    at(world, start, 50)
    async with world.db.transaction() as session:
        run = await session.scalar(select(Run).where(Run.name == "llama-sft"))
        assert run is not None
        await lifecycle.stop_run(session, world.clock, run, "member")
    at(world, start, 101)
    await heard(world, "gpu-08")
    at(world, start, 105)
    await check_leases(world)

    silent = start + timedelta(seconds=40)
    for worker in await world.workers("llama-sft"):
        assert (worker.state, worker.last_failure) == ("Failed", snapshot(silent))
    assert await world.status("llama-sft") == ("Stopped", "Stopped by member")
    at(world, start, 121)
    await tick(world)
    assert await ledger(world) == {
        ("starting", True): 2 * 4 * 5,
        ("productive", True): 2 * 4 * 35,
        ("failure", True): 2 * 4 * 65,
    }
