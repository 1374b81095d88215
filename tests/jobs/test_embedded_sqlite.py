"""The embedded mode's job threads share one event loop and one database handle
(backend/jobs/runtime.py): on SQLite, which takes one writer at a time, their transactions
are taken one after the other in that loop (issue 19), instead of each waiting for the
file's lock up to its busy timeout (10 s) and failing "database is locked" when a long one
holds it longer."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from backend.config import Settings
from backend.jobs import actors, runtime
from tests.support import server_settings


async def test_the_job_threads_write_one_at_a_time_on_sqlite(
    database_url: str, tmp_path: object
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's one writer")
    settings: Settings = server_settings(database_url, tmp_path)  # type: ignore[arg-type]
    runtime.configure(settings)
    db = runtime.database()
    try:
        held = asyncio.Event()

        async def long_transaction() -> None:  # longer than SQLite's busy timeout (10 s)
            async with db.transaction() as session:
                await session.execute(text("SELECT 1"))
                held.set()
                await asyncio.sleep(11)

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
