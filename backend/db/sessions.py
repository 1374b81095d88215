"""The server's handle on its database: transactions, units of work tried again when they
lose to another, and read sessions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from backend.db.engine import IMMEDIATE, READ_ONLY, create_engine_for
from backend.db.retries import ATTEMPTS, FIRST_WAIT_SECONDS, tried_again

T = TypeVar("T")


class Database:
    """The server's handle on its database: one engine, sessions made from it."""

    def __init__(self, engine: AsyncEngine, *, one_writer: bool = False) -> None:
        self.engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False, autoflush=False)
        # On SQLite (one writer at a time), the handle's write transactions may be taken one
        # after the other here, in its event loop, rather than each holding a connection and
        # waiting up to the busy timeout for the file's lock ("database is locked" when a
        # long one holds it longer). The embedded mode's job threads share one loop and one
        # handle: they write one at a time (issue 19). Only for a handle whose transactions
        # never open another one of the same handle inside them.
        self._writer = asyncio.Lock() if one_writer and engine.dialect.name == "sqlite" else None

    @classmethod
    def from_url(
        cls, url: str, *, pool_size: int = 10, echo: bool = False, one_writer: bool = False
    ) -> Database:
        return cls(create_engine_for(url, pool_size=pool_size, echo=echo), one_writer=one_writer)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A session whose work is committed on success and rolled back on any error."""
        if self._writer is None:
            async with self._transaction() as session:
                yield session
            return
        async with self._writer, self._transaction() as session:
            yield session

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncSession]:
        async with self._sessions() as session, session.begin():
            if self.engine.dialect.name == "sqlite":
                await session.connection(execution_options=IMMEDIATE)
            yield session

    async def unit(
        self,
        work: Callable[[AsyncSession], Awaitable[T]],
        *,
        attempts: int = ATTEMPTS,
        first_wait: float = FIRST_WAIT_SECONDS,
    ) -> T:
        """``work`` in a transaction of its own (as ``transaction``), tried again whole if it
        lost to another transaction (a deadlock, a serialisation failure, SQLite's locked
        file): up to ``attempts`` tries, waiting a random time up to ``first_wait`` doubled
        at each. If it still loses, ConflictRetry (409 CONFLICT_RETRY): the caller may send
        it again. ``work`` must do all it changes in the database through its session (it
        may run more than once, and only the last run's changes are kept)."""

        async def once() -> T:
            async with self.transaction() as session:
                return await work(session)

        return await tried_again(once, attempts=attempts, first_wait=first_wait)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A session for reading, and what it loaded stays readable after it.

        On PostgreSQL its transaction is READ ONLY (a write in it fails, it is never kept),
        and it ends with a COMMIT where it succeeded: psycopg forgets every statement it has
        prepared on a ROLLBACK, so reads that rolled back made the connection parse and plan
        each statement anew (issue 24: a range query planned its statement every time). On
        an error it rolls back."""
        async with self._sessions() as session:
            if self.engine.dialect.name == "postgresql":
                await session.connection(execution_options=READ_ONLY)
            yield session
            if session.in_transaction():
                await session.commit()

    async def dispose(self) -> None:
        await self.engine.dispose()
