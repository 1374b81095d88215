"""The events bell on SQLite and PostgreSQL: one look at the events a second per process,
however many subscribers wait, and every one of them woken when the horizon moves; the
horizon waits for an event committed after a newer one."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from backend.db import Database
from backend.events.bell import Bell
from backend.models import Event, Organization
from tests.support import SEED_TIME, FakeClock, Tenancy
from tests.support.agents import wait_for


async def add_event(db: Database, event_id: int | None = None) -> None:
    async with db.transaction() as session:
        organization = await session.scalar(select(Organization.id).limit(1))
        assert organization is not None
        session.add(
            Event(
                id=event_id,
                organization_id=organization,
                kind="quota",
                reason="a test event",
                data={},
                created_at=SEED_TIME,
            )
        )


async def first_look(bell: Bell) -> None:
    """Until the bell has made its first look (a second at most), not a fixed sleep."""

    async def looked() -> bool:
        return bell.looks >= 1

    await wait_for("the bell's first look", looked, 5)


async def waiting(bell: Bell, subscribers: int) -> list[asyncio.Task[None]]:
    """Subscribers waiting on the bell after its first look (which rings: what became visible
    between a subscriber's read and its wait must wake it)."""
    ready = asyncio.Event()

    async def subscriber() -> None:
        async with bell.listening():
            await ready.wait()
            await bell.wait(bell.rings)

    tasks = [asyncio.create_task(subscriber()) for _ in range(subscribers)]
    await first_look(bell)
    ready.set()
    await asyncio.sleep(0.1)
    return tasks


async def test_twenty_subscribers_share_one_look_a_second_and_all_wake_at_a_new_event(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    await add_event(db)
    bell = Bell(db, look_seconds=0.2, idle_seconds=30.0)
    tasks = await waiting(bell, 20)
    looks = bell.looks
    await asyncio.sleep(1.0)
    assert 3 <= bell.looks - looks <= 7  # five looks in a second of 0.2 s ones, not 100
    assert not any(t.done() for t in tasks)
    await add_event(db)
    done, _ = await asyncio.wait(tasks, timeout=2.0)
    assert len(done) == 20  # all of them, well before their 30 s
    await asyncio.sleep(0.5)
    looks = bell.looks
    await asyncio.sleep(0.6)
    assert bell.looks == looks  # nobody waits: the bell does not look


async def test_the_horizon_waits_for_an_event_committed_after_a_newer_one(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # ids are taken when written; a transaction may commit after one that took a larger id
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: its ids become visible in order")
    await add_event(db)
    bell = Bell(db, look_seconds=0.1, idle_seconds=30.0)
    async with bell.listening():
        before = await bell.settled()
        async with db.transaction() as late:
            organization = await late.scalar(select(Organization.id).limit(1))
            event = Event(
                organization_id=organization,
                kind="quota",
                reason="committed late",
                data={},
                created_at=SEED_TIME,
            )
            late.add(event)
            await late.flush()  # its id is taken
            await add_event(db)  # a larger id, committed first
            tasks = await waiting(bell, 3)
            await asyncio.sleep(0.5)  # five looks: the larger id is visible, the smaller not
            assert bell.horizon == before < event.id
            assert not any(t.done() for t in tasks)
        # the late one commits: both are settled, and the bell rings
        done, _ = await asyncio.wait(tasks, timeout=2.0)
        assert len(done) == 3
        assert bell.horizon == event.id + 1


async def test_a_subscriber_waits_not_for_a_ring_that_came_after_its_read(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    bell = Bell(db, look_seconds=0.2, idle_seconds=30.0)
    async with bell.listening():
        await first_look(bell)
        rings = bell.rings  # taken before the subscriber's read
        await add_event(db)  # visible after its read

        async def rang() -> bool:
            return bell.rings > rings

        await wait_for("the bell to ring", rang, 5)  # meanwhile
        await asyncio.wait_for(bell.wait(rings), timeout=0.1)  # at once


async def test_no_look_outlives_the_last_subscriber(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """A subscriber that goes at once, before the bell's first look has read: the look ends
    with it, its read done and its connection back in the pool, and a later subscriber's
    bell looks again. (A look left running read on after every subscriber had gone, into the
    test's teardown, and the event loop's end cancelled it holding its connection.)"""
    bell = Bell(db, look_seconds=0.2, idle_seconds=30.0)

    def looking() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if "Bell._look" in repr(t.get_coro())]

    async with bell.listening():
        assert bell.looks == 0 and len(looking()) == 1
    assert not looking()
    assert db.engine.pool.checkedout() == 0
    looks = bell.looks
    await asyncio.sleep(0.5)  # two looks' time: none without a subscriber
    assert bell.looks == looks

    async def looked_again() -> bool:
        return bell.looks > looks + 1

    async with bell.listening():
        await wait_for("the next subscriber's looks", looked_again, 5)
    assert not looking()
