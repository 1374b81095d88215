"""What a database error says (the transaction lost to another; the database is away), and
a unit of work tried again whole when it lost."""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import psycopg
import psycopg.errors
from sqlalchemy.exc import DBAPIError

from backend.errors import ConflictRetry

log = logging.getLogger(__name__)
T = TypeVar("T")


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


async def tried_again(
    attempt: Callable[[], Awaitable[T]],
    *,
    attempts: int = ATTEMPTS,
    first_wait: float = FIRST_WAIT_SECONDS,
) -> T:
    """``attempt`` (a transaction of its own), tried again whole if it lost to another
    transaction: up to ``attempts`` tries, waiting a random time up to ``first_wait`` doubled
    at each. If it still loses, ConflictRetry (409 CONFLICT_RETRY): the caller may send it
    again. Any other error is raised as it is, at once."""
    for tried in range(1, attempts + 1):
        try:
            return await attempt()
        except Exception as error:
            if not contention(error):
                raise
            if tried == attempts:
                log.warning("a unit of work lost to others %d times: %s", attempts, error)
                raise ConflictRetry() from error
            log.info("a unit of work lost to another (try %d): %s", tried, error)
            await asyncio.sleep(random.uniform(0, first_wait * 2 ** (tried - 1)))
    raise AssertionError("unreachable")  # pragma: no cover
