"""Other processes' commits heard on PostgreSQL: one connection of its own that LISTENs on
commit_signals' channel and calls this process's listeners of each table a notice names.

While it is connected, a listener may poll rarely: what another process commits reaches it
within the notice's round trip. Each time it connects (the first time, and after the
connection was lost), every listener is called once: what was committed while no one listened
is looked for then. ``connected`` says whether it listens now; SQLite has no notices (the
embedded server's writers share its process, and its listeners hear their commits there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import psycopg
from sqlalchemy.engine import make_url

from backend.db import commit_signals

log = logging.getLogger(__name__)

RETRY_FIRST_S, RETRY_MOST_S = 0.5, 10.0


def libpq_url(url: str) -> str | None:
    """The URL as libpq takes it; None for a database without notices (SQLite)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return None
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


class Notices:
    """Listens while ``listening()`` is entered."""

    def __init__(self, url: str) -> None:
        self._url = libpq_url(url)
        self._connected = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def wait_connected(self) -> None:
        await self._connected.wait()

    @contextlib.asynccontextmanager
    async def listening(self) -> AsyncIterator[Notices]:
        task = asyncio.create_task(self._listen()) if self._url else None
        try:
            yield self
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._connected.clear()

    async def _listen(self) -> None:
        assert self._url is not None
        wait = RETRY_FIRST_S
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, application_name="astraeus notices"
                ) as conn:
                    await conn.execute(f"LISTEN {commit_signals.CHANNEL}")
                    self._connected.set()
                    wait = RETRY_FIRST_S
                    for table in sorted(commit_signals.ANNOUNCED):  # what came meanwhile
                        commit_signals.heard(table)
                    async for notice in conn.notifies():
                        if notice.payload in commit_signals.ANNOUNCED:
                            commit_signals.heard(notice.payload)
            except (psycopg.Error, OSError) as error:
                if self.connected:
                    log.warning("notices of other processes' commits lost (%s): polling", error)
            finally:
                self._connected.clear()
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MOST_S)
