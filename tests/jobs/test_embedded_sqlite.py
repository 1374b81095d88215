"""The embedded mode's job threads share one event loop and one database handle
(backend/jobs/runtime.py): on SQLite, which takes one writer at a time, their transactions
are taken one after the other in that loop (issue 19), instead of each waiting for the
file's lock up to its busy timeout (10 s) and failing "database is locked" when a long one
holds it longer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event, text

from backend.config import Settings
from backend.db.retries import ATTEMPTS
from backend.jobs import actors, runtime
from tests.support import server_settings

# The handle's busy timeout cut from the product's 10 s, so that a transaction held for
# HELD_S outlasts every try of a unit of work (ATTEMPTS waits for the lock, and the waits
# between them, under 0.35 s): each job's write would fail but for the one writer (held 11 s
# past the 10 s, the test took 11 s, and passed without it, on db.unit's later tries).
BUSY_TIMEOUT_MS = 200
HELD_S = 3.0


def _short_busy_timeout(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cursor.close()


async def test_the_job_threads_write_one_at_a_time_on_sqlite(
    database_url: str, tmp_path: object
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's one writer")
    assert HELD_S > ATTEMPTS * BUSY_TIMEOUT_MS / 1000 + 0.35 + 1.0  # a second to spare
    settings: Settings = server_settings(database_url, tmp_path)  # type: ignore[arg-type]
    runtime.configure(settings)
    db = runtime.database()
    event.listen(db.engine.sync_engine, "connect", _short_busy_timeout)  # after the product's
    try:
        held = asyncio.Event()

        async def long_transaction() -> None:  # longer than every try at the lock
            async with db.transaction() as session:
                await session.execute(text("SELECT 1"))
                held.set()
                await asyncio.sleep(HELD_S)

        longest = asyncio.create_task(long_transaction())
        await held.wait()
        # what the job threads run meanwhile, each a write transaction of its own
        await asyncio.wait_for(
            asyncio.gather(
                actors.machines_check_leases(),
                actors.accounting_tick(),
                actors.scheduling_pass(),
            ),
            60,
        )
        await longest
    finally:
        await db.dispose()
        runtime.configure(settings)
