"""The first check of the leases, in two processes at once (issue 19: two schedulers, or a
scheduler and a worker's machines.check_leases, starting together both found no lease_checks
row and both inserted it: the second failed on its key, "duplicate key value violates unique
constraint pk_lease_checks"). The second now records its check on the row the first wrote."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import select

from backend.db import Database
from backend.machines import service as machines
from backend.models import LeaseCheck
from tests.support import FakeClock

LEASE = timedelta(seconds=60)


async def test_two_first_checks_at_once_both_succeed(db: Database, clock: FakeClock) -> None:
    first_wrote = asyncio.Event()
    second_began = asyncio.Event()
    first_at = clock.now()
    second_at = first_at + timedelta(seconds=1)
    second_clock = FakeClock(second_at)

    async def first() -> None:
        async with db.transaction() as session:
            await machines.expire_leases(session, clock, LEASE)
            first_wrote.set()
            await second_began.wait()
            # the second's insert waits for this one's on PostgreSQL (SQLite takes the two
            # one after the other from their BEGIN)
            await asyncio.sleep(0.5)

    async def second() -> None:
        await first_wrote.wait()
        second_began.set()
        async with db.transaction() as session:
            await machines.expire_leases(session, second_clock, LEASE)

    await asyncio.wait_for(asyncio.gather(first(), second()), 30)
    async with db.read() as session:
        rows = list(await session.scalars(select(LeaseCheck)))
    assert [(r.previous_at, r.checked_at) for r in rows] == [(first_at, second_at)]


async def test_a_check_after_the_first_records_the_one_before(
    db: Database, clock: FakeClock
) -> None:
    for _ in range(3):
        async with db.transaction() as session:
            await machines.expire_leases(session, clock, LEASE)
        clock.advance(seconds=5)
    async with db.read() as session:
        check = await session.scalar(select(LeaseCheck))
    assert check is not None
    assert check.checked_at - check.previous_at == timedelta(seconds=5)
