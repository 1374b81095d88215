"""The server's connections are pooled, on SQLite too (issue 39: an embedded server opened a
connection for each transaction, 1.7 ms of CPU more than the transaction's own), and a
connection whose work was cut off inside its transaction never goes back into use holding it:
on SQLite it would hold the file's one write lock while it waits in the pool."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select, text

from backend.db import Database
from backend.db.engine import left_dirty
from backend.models import Run

pytestmark = pytest.mark.db


async def _driver_id(db: Database) -> int:
    async with db.transaction() as session:
        raw = await (await session.connection()).get_raw_connection()
        await session.execute(select(Run.id).limit(1))
        return id(raw.driver_connection)


async def test_transactions_one_after_another_share_a_connection(db: Database) -> None:
    used = {await _driver_id(db) for _ in range(5)}
    assert len(used) == 1


async def test_a_transaction_cut_off_leaves_nothing_held(db: Database, database_url: str) -> None:
    """A request cut at its time budget inside its write transaction: another handle's write
    goes through at once, and this handle's next transaction is not in the cut one."""
    inside = asyncio.Event()

    async def cut_off() -> None:
        async with db.transaction() as session:
            await session.execute(text("UPDATE runs SET name = name WHERE id < 0"))
            inside.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(cut_off())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    other = Database.from_url(database_url, pool_size=1)
    try:
        async with asyncio.timeout(5):  # SQLite's busy timeout is 10 s: no wait at all
            async with other.transaction() as session:
                await session.execute(text("UPDATE runs SET name = name WHERE id < 0"))
    finally:
        await other.dispose()
    async with asyncio.timeout(5):
        for _ in range(3):  # and this handle's own connections write again
            async with db.transaction() as session:
                await session.execute(text("UPDATE runs SET name = name WHERE id < 0"))


async def test_a_connection_left_in_a_transaction_is_never_handed_out(db: Database) -> None:
    """Its work cancelled between its last statement and the pool's reset: the pool's check
    at checkout sees the transaction (on SQLite, the file's write lock) and drops it."""
    raw = await db.engine.raw_connection()
    try:
        driver = raw.driver_connection
        assert not left_dirty(raw.dbapi_connection)
        begin = "BEGIN IMMEDIATE" if db.engine.dialect.name == "sqlite" else "BEGIN"
        await driver.execute(begin)
        assert left_dirty(raw.dbapi_connection)
        await driver.execute("ROLLBACK")
        assert not left_dirty(raw.dbapi_connection)
    finally:
        raw.close()
