"""Listeners told, once a transaction commits, that it added rows to a table (or, said so
explicitly, changed them): the agent streams' command delivery hears of new commands at once
instead of at its next poll, and of a revoked machine credential.

In this process, after the commit. Across processes, on PostgreSQL, for the tables in
``ANNOUNCED``: the transaction itself sends ``NOTIFY astraeus_rows, '<table>'`` as it commits
(PostgreSQL delivers it on the commit, never on a rollback), and a process listening
(backend/db/notices.py: the server's agent endpoint) calls its own listeners of that table. The
scheduler's and the jobs' processes write commands; the replica holding the machine's stream
sends them: without the notice it found them at its next poll (0.5 s, two queries a second
whatever the load, issue 40)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

_ADDED = "astraeus.rows_added"
_listeners: dict[str, list[Callable[[], None]]] = {}
# Tables whose committed rows are announced to other processes (PostgreSQL), and the channel:
# new commands for the machines' streams, revoked machine credentials and join tokens.
ANNOUNCED = frozenset({"agent_commands", "machine_credentials", "join_tokens"})
CHANNEL = "astraeus_rows"


def on_rows_committed(table: str, listener: Callable[[], None]) -> Callable[[], None]:
    """Call ``listener`` after each commit in this process that added rows to ``table``
    (in the committing thread: a listener of another event loop hands itself over with
    ``call_soon_threadsafe``). Returns what removes it."""
    _listeners.setdefault(table, []).append(listener)

    def remove() -> None:
        listeners = _listeners.get(table, [])
        if listener in listeners:
            listeners.remove(listener)
        if not listeners:
            _listeners.pop(table, None)

    return remove


def rows_added(session: AsyncSession | Session, table: str) -> None:
    """This session's transaction added rows to ``table`` other than through the ORM's
    flush (an INSERT or COPY of many rows: backend/db/bulk.py)."""
    if table in _listeners or table in ANNOUNCED:
        sync = session.sync_session if isinstance(session, AsyncSession) else session
        sync.info.setdefault(_ADDED, set()).add(table)


def rows_changed(session: AsyncSession | Session, table: str) -> None:
    """This session's transaction changed rows of ``table`` that its listeners must hear of
    (a credential revoked): the ORM's flush tells only of rows added."""
    rows_added(session, table)


def heard(table: str) -> None:
    """Another process committed rows of ``table`` (its notice, backend/db/notices.py): this
    process's listeners of it are called."""
    _call(table)


@event.listens_for(Session, "after_flush")
def _flushed(session: Session, _context: object) -> None:
    tables = {getattr(type(row), "__tablename__", None) for row in session.new}
    wanted = tables.intersection(_listeners) | tables.intersection(ANNOUNCED)
    if wanted:
        session.info.setdefault(_ADDED, set()).update(wanted)


@event.listens_for(Session, "before_commit")
def _announce(session: Session) -> None:
    """On PostgreSQL, the notice of each announced table this transaction added rows to, sent
    with the transaction: delivered when it commits, dropped if it does not."""
    # (rows added and not flushed yet are flushed after this, as the commit begins)
    pending = {getattr(type(row), "__tablename__", None) for row in session.new}
    tables = sorted((session.info.get(_ADDED, set()) | pending) & ANNOUNCED)
    if not tables:
        return
    bind = session.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for table in tables:
        session.execute(
            text("SELECT pg_notify(:channel, :table)"), {"channel": CHANNEL, "table": table}
        )


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    tables: set[str] = session.info.pop(_ADDED, set())
    for table in tables:
        _call(table)


def _call(table: str) -> None:
    for listener in list(_listeners.get(table, [])):
        try:
            listener()
        except Exception:  # a listener's failure is never the commit's
            log.exception("a listener of rows committed to %s failed", table)


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_ADDED, None)
