"""Engines, sessions and the column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from sqlalchemy import JSON, BigInteger, DateTime, Integer, MetaData, bindparam, event, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Dialect, Engine, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key
from sqlalchemy.pool import NullPool
from sqlalchemy.types import TypeDecorator

from backend.errors import ConflictRetry

log = logging.getLogger(__name__)
T = TypeVar("T")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# An autoincrementing 64-bit key on PostgreSQL; SQLite only autoincrements INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")

# JSONB on PostgreSQL (indexable, compact), JSON text elsewhere.
PortableJSON = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always UTC and always timezone-aware in Python.

    SQLite keeps no zone, so values are stored as naive UTC and made aware again on load.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given; Astraeus stores UTC times only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


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


def _left_dirty(dbapi_connection: Any) -> bool:
    """Whether psycopg says the connection is not as the pool should have it: idle, outside
    any transaction, not read only (read locally: no round trip)."""
    driver = getattr(dbapi_connection, "driver_connection", None)
    if not isinstance(driver, psycopg.AsyncConnection | psycopg.Connection):
        return False
    idle = driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return not idle or bool(driver.read_only)


def install_pings(engine: Engine) -> None:
    dialect = engine.dialect

    def ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if _left_dirty(dbapi_connection):
            # returned mid-transaction or still read only (its work was cancelled before it
            # was reset, as a request cut at its time budget is): never handed out again
            raise DisconnectionError("a pooled connection was returned in a transaction")
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
    target = async_url(url)
    if make_url(target).get_backend_name() == "sqlite":
        engine = create_async_engine(target, echo=echo, poolclass=NullPool)
    else:
        engine = create_async_engine(target, echo=echo, pool_size=pool_size, max_overflow=pool_size)
        install_pings(engine.sync_engine)
    install_sqlite_pragmas(engine.sync_engine)
    install_sqlite_transactions(engine.sync_engine)
    return engine


def _causes(error: BaseException) -> Iterable[BaseException]:
    """The error, what it wraps (a driver's error) and what caused it, each once."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        yield found
        wrapped = found.orig if isinstance(found, DBAPIError) else None
        found = wrapped or found.__cause__ or found.__context__


# PostgreSQL's deadlock (40P01) and serialisation failure (40001): the transaction was chosen
# to give way to another; the same work tried again succeeds.
CONTENTION_STATES = frozenset({"40P01", "40001"})


def contention(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the transaction lost to another one: a
    deadlock or a serialisation failure on PostgreSQL, SQLite's locked (busy) file. Work that
    met it can be tried again whole; the database is not away."""
    for found in _causes(error):
        if isinstance(found, psycopg.errors.TransactionRollback):
            return True
        if isinstance(found, psycopg.Error) and found.sqlstate in CONTENTION_STATES:
            return True
        if isinstance(found, sqlite3.OperationalError) and (
            "database is locked" in str(found) or "database is busy" in str(found)
        ):
            return True
    return False


def database_away(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the database cannot be reached: a refused or
    lost connection, a server shutting down. Not a SQL error, nor SQLite's busy file.

    psycopg counts a deadlock and a serialisation failure as operational errors too, and so
    does this: the callers that wait and try again later (an agent's messages, lease renewals)
    do so for them as well. What answers a request asks ``contention`` first, and says
    CONFLICT_RETRY (409), never that the database is away (issue 19)."""
    for found in _causes(error):
        if isinstance(found, DBAPIError) and found.connection_invalidated:
            return True
        if isinstance(found, psycopg.OperationalError | ConnectionError):
            return True
    return False


# How often a unit of work that lost to another transaction is tried in all, and the first
# wait between tries (doubled each time, with full jitter: tries that collided do not again).
ATTEMPTS = 5
FIRST_WAIT_SECONDS = 0.02


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
        for attempt in range(1, attempts + 1):
            try:
                async with self.transaction() as session:
                    return await work(session)
            except Exception as error:
                if not contention(error):
                    raise
                if attempt == attempts:
                    log.warning("a unit of work lost to others %d times: %s", attempts, error)
                    raise ConflictRetry() from error
                log.info("a unit of work lost to another (try %d): %s", attempt, error)
                await asyncio.sleep(random.uniform(0, first_wait * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")  # pragma: no cover

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


async def driver_connection(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The session's own psycopg connection, inside the session's transaction (PostgreSQL)."""
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection), "a PostgreSQL session is needed"
    return driver


async def copy_binary(
    session: AsyncSession,
    table: str,
    columns: Sequence[str],
    types: Sequence[str],
    rows: Iterable[Sequence[Any]],
) -> int:
    """Append rows with ``COPY … FROM STDIN (FORMAT BINARY)``, in the session's transaction.

    Binary COPY is the fastest way into PostgreSQL from Python: the client sends the values as
    they are, with no text to format or parse (PERFORMANCE.md: ~300k rows/s against ~35k for
    SQLAlchemy inserts). ``types`` are PostgreSQL type names, one per column. Returns the
    number of rows written."""
    pg = await driver_connection(session)
    statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
    async with pg.cursor() as cursor:
        async with cursor.copy(statement) as copy:
            copy.set_types(list(types))
            for row in rows:
                await copy.write_row(row)
        return cursor.rowcount


async def insert_many(session: AsyncSession, model: type[Any], rows: list[dict[str, Any]]) -> None:
    """Many new rows at once: binary COPY on PostgreSQL, one executemany elsewhere.

    History rows come by the thousand in a scheduling pass; COPY takes them an order of
    magnitude faster than INSERTs, and binary COPY sends the values as they are (issue 24: a
    first pass's 13 000 rows took 0.29 s by text COPY). Every row has the first row's keys."""
    if not rows:
        return
    table = model.__table__
    if session.get_bind().dialect.name != "postgresql":
        await session.execute(table.insert(), rows)
        return
    columns = tuple(rows[0])
    values = operator.itemgetter(*columns)
    await copy_binary(
        session,
        table.name,
        columns,
        _pg_types(table, columns),
        (values(row) if len(columns) > 1 else (values(row),) for row in rows),
    )


async def update_many(
    session: AsyncSession, model: type[Any], changes: dict[int, dict[str, Any]]
) -> None:
    """Many rows changed at once: for each row's ``id``, the columns it changes and their new
    values (a column's attribute and its name are the same). On PostgreSQL one UPDATE from
    arrays for each set of columns changed, elsewhere one executemany for each (issue 24: the
    ORM's flush of a first pass's 4 803 changed runs and workers took 0.25 s). The session's
    own objects of those rows, where it holds some, take the new values as loaded: they agree
    with the database, and the session writes none of them again."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for row_id, values in changes.items():
        if values:
            groups.setdefault(tuple(values), []).append(row_id)
    table = model.__table__
    dialect = session.get_bind().dialect
    for columns, ids in groups.items():
        rows = [changes[i] for i in ids]
        if dialect.name == "postgresql":
            await _update_from_arrays(session, table, columns, ids, rows)
        else:
            await _update_each(session, table, columns, ids, rows)
    _as_loaded(session, model, changes)


async def _update_from_arrays(
    session: AsyncSession,
    table: Any,
    columns: tuple[str, ...],
    ids: list[int],
    rows: list[dict[str, Any]],
) -> None:
    dialect = session.get_bind().dialect
    types = _pg_types(table, columns)
    arrays: list[list[Any]] = [ids]
    for name, pg_type in zip(columns, types, strict=True):
        # An array holds values of one Python type: 1 and 2.5 both float, "a" and an enum str.
        process = table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
        process = process or _ARRAY_VALUES.get(pg_type)
        values = [row[name] for row in rows]
        arrays.append([None if v is None else process(v) for v in values] if process else values)
    sets = ", ".join(f"{c} = v.{c}" for c in columns)
    # Binary arrays: a text array of 8 652 sentences takes psycopg and the server 0.06 s to write
    # and parse, the same in binary 0.01 s.
    casts = ", ".join(f"%b::{t}[]" for t in ("int8", *types))
    statement = (
        f"UPDATE {table.name} SET {sets} FROM unnest({casts}) AS v(id, {', '.join(columns)}) "
        f"WHERE {table.name}.id = v.id"
    )
    pg = await driver_connection(session)
    async with pg.cursor() as cursor:
        await cursor.execute(statement, arrays)


async def _update_each(
    session: AsyncSession,
    table: Any,
    columns: tuple[str, ...],
    ids: list[int],
    rows: list[dict[str, Any]],
) -> None:
    statement = (
        update(table)
        .where(table.c.id == bindparam("_id"))
        .values({c: bindparam(f"_{c}") for c in columns})
    )
    params = [
        {"_id": i, **{f"_{c}": row[c] for c in columns}} for i, row in zip(ids, rows, strict=True)
    ]
    await session.execute(statement, params)


def _as_loaded(session: AsyncSession, model: type[Any], changes: dict[int, dict[str, Any]]) -> None:
    identities = session.sync_session.identity_map
    if not len(identities):
        return
    for row_id, values in changes.items():
        held = identities.get(identity_key(model, row_id))
        if held is not None:
            for name, value in values.items():
                set_committed_value(held, name, value)


# The PostgreSQL type of each column type of ours, by its SQL there: what binary COPY sends,
# what an UPDATE's arrays are cast to.
_PG_TYPES = {
    "BIGINT": "int8",
    "INTEGER": "int4",
    "SMALLINT": "int2",
    "BOOLEAN": "bool",
    "FLOAT": "float8",
    "DOUBLE PRECISION": "float8",
    "TIMESTAMP WITH TIME ZONE": "timestamptz",
    "JSONB": "jsonb",
    "TEXT": "text",
}


_ARRAY_VALUES: dict[str, Callable[[Any], Any]] = {"float8": float, "text": str}


@functools.cache
def _pg_types(table: Any, columns: tuple[str, ...]) -> tuple[str, ...]:
    dialect = postgresql.dialect()
    sql = [table.c[name].type.compile(dialect=dialect) for name in columns]
    return tuple("text" if s.startswith("VARCHAR") else _PG_TYPES[s] for s in sql)


# -- jobs sent by the transaction that needs them, once it commits --------------------------------

_AFTER_COMMIT = "astraeus.after_commit"
_job_sender: Callable[[str], None] | None = None


def send_jobs_with(sender: Callable[[str], None] | None) -> None:
    """Where jobs asked for with ``after_commit`` go: the broker's send (backend/jobs/broker.py
    installs it). None in a process without a broker (a CLI command): the periodic jobs catch up."""
    global _job_sender
    _job_sender = sender


def after_commit(session: AsyncSession, job: str) -> None:
    """Send the job named ``job`` once this session's transaction has committed: never before
    (the job would not see what it changed), never if it rolls back, and only the try that
    commits of a unit tried again. Each job once per transaction, however often asked."""
    jobs: list[str] = session.info.setdefault(_AFTER_COMMIT, [])
    if job not in jobs:
        jobs.append(job)


@event.listens_for(Session, "after_commit")
def _send_after_commit(session: Session) -> None:
    jobs: list[str] = session.info.pop(_AFTER_COMMIT, [])
    if _job_sender is not None:
        for job in jobs:
            _job_sender(job)


@event.listens_for(Session, "after_rollback")
def _forget_after_rollback(session: Session) -> None:
    session.info.pop(_AFTER_COMMIT, None)
