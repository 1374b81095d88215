"""All SQL of the events domain: a workspace's events by page or after a cursor, and the
newest id every reader may see (the events bell's horizon)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from backend.events.rules import DELETED_STATE
from backend.models import Event


async def newest_first(
    session: AsyncSession,
    workspace_id: int,
    *,
    name: str | None,
    kind: str | None,
    before: int | None,
    upto: int | None,
    limit: int,
) -> list[Event]:
    """The workspace's events below ``before`` and up to ``upto``, newest first."""
    query = _matching(select(Event).where(Event.workspace_id == workspace_id), name, kind)
    if before is not None:
        query = query.where(Event.id < before)
    if upto is not None:
        query = query.where(Event.id <= upto)
    return list(await session.scalars(query.order_by(Event.id.desc()).limit(limit)))


async def oldest_first_after(
    session: AsyncSession,
    workspace_id: int,
    cursor: int,
    *,
    name: str | None,
    kind: str | None,
    upto: int | None,
    limit: int,
) -> list[Event]:
    """The workspace's events after the id ``cursor`` and up to ``upto``, oldest first."""
    query = _matching(
        select(Event).where(Event.workspace_id == workspace_id, Event.id > cursor), name, kind
    )
    if upto is not None:
        query = query.where(Event.id <= upto)
    return list(await session.scalars(query.order_by(Event.id).limit(limit)))


def _matching(query: Select[Any], name: str | None, kind: str | None) -> Select[Any]:
    if name is not None:
        query = query.where(Event.run_name == name)
    if kind is not None:
        wanted = (Event.kind == kind) | Event.kind.startswith(kind + ".")
        old_deleted = (Event.kind == "run.state") & (Event.state == DELETED_STATE)
        if kind == "run.deleted":  # rows from before it had its own kind
            wanted = wanted | old_deleted
        elif kind == "run.state":
            wanted = wanted & ~old_deleted
        query = query.where(wanted)
    return query


async def last_id(session: AsyncSession, workspace_id: int) -> int:
    found = await session.scalar(
        select(func.max(Event.id)).where(Event.workspace_id == workspace_id)
    )
    return int(found or 0)


async def newest_id(session: AsyncSession) -> int:
    """The newest event's id, of any workspace."""
    return int(await session.scalar(select(func.max(Event.id))) or 0)


# -- PostgreSQL: which ids are taken, and by which transactions still open ------------------------

_SEQUENCE = text(
    "SELECT CAST(coalesce(pg_get_serial_sequence('events', 'id'), 'events_id_seq') AS regclass)"
    "::oid"
)
_LAST_ID = text("SELECT coalesce(pg_sequence_last_value(CAST(:sequence AS oid)), 0)")
# (pg_sequence_last_value locks the sequence too: the look's own transaction is left out)
_HOLDERS = text(
    "SELECT virtualtransaction FROM pg_locks WHERE locktype = 'relation' "
    "AND relation = CAST(:sequence AS oid) AND pid IS DISTINCT FROM pg_backend_pid() "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def id_sequence(session: AsyncSession) -> int:
    """The oid of the sequence event ids are taken from."""
    return int((await session.execute(_SEQUENCE)).scalar_one())


async def last_taken_id(session: AsyncSession, sequence: int) -> int:
    """The last id taken from the sequence, committed or not."""
    return int((await session.execute(_LAST_ID, {"sequence": sequence})).scalar_one())


async def sequence_holders(session: AsyncSession, sequence: int) -> frozenset[str]:
    """The other transactions that took ids from the sequence and are still open."""
    return frozenset((await session.scalars(_HOLDERS, {"sequence": sequence})).all())
