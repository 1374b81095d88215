"""Engines: the URL for each driver, SQLite's pragmas and transactions as we begin them, the
pool's pings, and the session's own psycopg connection where PostgreSQL's fast paths need it."""

from __future__ import annotations

import time
from typing import Any

import aiosqlite
import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine


def sync_url(url: str) -> str:
    """The URL for a blocking driver (migrations, admin commands)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.set(drivername="sqlite").render_as_string(hide_password=False)
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def async_url(url: str) -> str:
    """The URL for the asyncio driver the server uses."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def install_sqlite_pragmas(engine: Engine) -> None:
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)


# Database.transaction() asks for this: on SQLite its session takes the write lock as it begins.
IMMEDIATE = {"sqlite_begin": "IMMEDIATE"}
# Database.read() asks for this on PostgreSQL: its transaction begins READ ONLY.
READ_ONLY = {"postgresql_readonly": True}


def _own_transactions(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # the driver begins nothing; _begin does


def _begin(connection: Connection) -> None:
    """A write transaction holds SQLite's write lock from its first statement, as a row lock
    (FOR UPDATE) would on PostgreSQL: two transactions that read a run and then write it are
    taken one after the other, never both on what the other has not committed yet. A read
    session begins a deferred transaction: one snapshot for all it reads."""
    mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
    connection.exec_driver_sql(f"BEGIN {mode}")


def install_sqlite_transactions(engine: Engine) -> None:
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _own_transactions)
        event.listen(engine, "begin", _begin)


# A pooled connection idle longer than this is pinged before it is used (a connection the
# server or the network dropped meanwhile is replaced, never handed out); one used within it
# is not: pinging every checkout cost the last hour's range query a round trip, a third of its
# bare statement (issue 24). One that died within the second fails its work like any query
# whose connection drops, and is replaced.
PING_AFTER_S = 1.0


def _checked_in(_dbapi_connection: Any, record: Any) -> None:
    record.info["idle_since"] = time.monotonic()


def left_dirty(dbapi_connection: Any) -> bool:
    """Whether the driver says the connection is not as the pool should have it: idle, outside
    any transaction, not read only (read locally: no round trip). On SQLite a connection left
    in a transaction would hold the file's write lock while it waits in the pool."""
    driver = getattr(dbapi_connection, "driver_connection", None)
    if isinstance(driver, aiosqlite.Connection):
        return driver.in_transaction
    if not isinstance(driver, psycopg.AsyncConnection | psycopg.Connection):
        return False
    idle = driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return not idle or bool(driver.read_only)


def install_pings(engine: Engine) -> None:
    dialect = engine.dialect
    sqlite = dialect.name == "sqlite"

    def ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if left_dirty(dbapi_connection):
            # returned mid-transaction or still read only (its work was cancelled before it
            # was reset, as a request cut at its time budget is): never handed out again
            raise DisconnectionError("a pooled connection was returned in a transaction")
        if sqlite:
            return  # a file's connection has no server or network to drop it
        since = record.info.get("idle_since")
        if since is not None and time.monotonic() - since < PING_AFTER_S:
            return
        cause: Exception | None = None
        try:
            alive = dialect.do_ping(dbapi_connection)  # the dialect's own (pool_pre_ping's)
        except Exception as error:
            alive, cause = False, error
        if not alive:
            # the pool drops this connection and checks out another (a new one if need be)
            raise DisconnectionError(f"a pooled connection no longer answers: {cause}")

    event.listen(engine.pool, "checkin", _checked_in)
    event.listen(engine.pool, "checkout", ping_if_idle)


def create_engine_for(url: str, *, pool_size: int = 10, echo: bool = False) -> AsyncEngine:
    """The server's engine: its connections pooled, on SQLite too (a connection opened for
    each transaction cost 1.7 ms of CPU more than the transaction's own 1.1 ms: the file
    opened, its schema read, a thread started)."""
    engine = create_async_engine(
        async_url(url), echo=echo, pool_size=pool_size, max_overflow=pool_size
    )
    install_pings(engine.sync_engine)
    install_sqlite_pragmas(engine.sync_engine)
    install_sqlite_transactions(engine.sync_engine)
    return engine


async def driver_connection(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The session's own psycopg connection, inside the session's transaction (PostgreSQL)."""
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection), "a PostgreSQL session is needed"
    return driver
