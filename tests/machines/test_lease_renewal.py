"""Renewing a replica's leases never waits behind another transaction's write of a machine
(issue 19: at 1 000 machines one held row kept every lease from being renewed, and machines
whose agents were alive were found lost): a held row is left for the next renewal, and is
neither renewed nor reported lost; a lost machine is reported lost."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from sqlalchemy import select, update

from backend.db import Database
from backend.machines import service as machines
from backend.models import Machine
from tests.lifecycle.world import LEASE, World


async def leases(db: Database) -> dict[str, object]:
    async with db.read() as session:
        return {m.name: m.lease_expires_at for m in await session.scalars(select(Machine))}


async def test_held_rows_are_left_for_the_next_renewal_lost_ones_reported(
    world: World, db: Database
) -> None:
    ids = {name: await world.machine(name) for name in ("gpu-0", "gpu-1", "gpu-2")}
    async with db.transaction() as session:
        await session.execute(
            update(Machine).where(Machine.id == ids["gpu-2"]).values(state="lost")
        )
    world.clock.advance(seconds=30)
    heard = dict.fromkeys(ids.values(), world.clock.now())
    if db.engine.dialect.name == "postgresql":
        async with db.transaction() as holder:  # a Hello registering gpu-1 again, say
            await holder.execute(
                update(Machine).where(Machine.id == ids["gpu-1"]).values(reason=Machine.reason)
            )
            began = time.monotonic()
            async with db.transaction() as session:
                renewal = await asyncio.wait_for(
                    machines.renew_leases(session, world.clock, heard, LEASE), 10
                )
            assert time.monotonic() - began < 5
        assert renewal == machines.Renewal(lost={ids["gpu-2"]}, held={ids["gpu-1"]})
        renewed = await leases(db)
        assert renewed["gpu-0"] == world.clock.now() + LEASE
        assert renewed["gpu-1"] == world.clock.now() - timedelta(seconds=30) + LEASE
    async with db.transaction() as session:  # nothing held now (SQLite: never)
        renewal = await machines.renew_leases(session, world.clock, heard, LEASE)
    assert renewal == machines.Renewal(lost={ids["gpu-2"]}, held=set())
    renewed = await leases(db)
    assert renewed["gpu-0"] == renewed["gpu-1"] == world.clock.now() + LEASE
