"""The workspace's events, as the events API lists them: every state change of its runs and
workers with its reason, deletions, quota, alerts (seed L-43 … L-46)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.errors import NotFound
from backend.events.rules import DELETED_STATE, FOUND_AT, MAX_LIMIT, EventView, Listing, shown_kind
from backend.models import Event, Workspace
from backend.organizations import service as organizations
from backend.runs import service as runs


async def listing(
    session: AsyncSession,
    principal: Principal,
    organization: str,
    workspace: str,
    which: Listing,
    upto: int | None = None,
) -> tuple[list[EventView], int | None]:
    """The events, newest first, and the id to ask the next page ``before`` (None: no more).
    A workspace the caller may not see is answered as absent."""
    ws = await workspace_of(session, principal, organization, workspace)
    return await page(session, ws, which, upto)


async def page(
    session: AsyncSession, ws: Workspace, which: Listing, upto: int | None = None
) -> tuple[list[EventView], int | None]:
    """A page of the workspace's events, newest first, and the id to ask the next before.

    With ``upto`` (the events bell's horizon), none above it: a reader that follows the
    events after the newest it listed misses none committed late below it."""
    query = _matching(select(Event).where(Event.workspace_id == ws.id), which.name, which.kind)
    if which.before is not None:
        query = query.where(Event.id < which.before)
    if upto is not None:
        query = query.where(Event.id <= upto)
    rows = list(await session.scalars(query.order_by(Event.id.desc()).limit(which.limit + 1)))
    more = len(rows) > which.limit
    rows = rows[: which.limit]
    views = [view(e, ws.name) for e in rows]
    return views, (rows[-1].id if more and rows else None)


async def workspace_of(
    session: AsyncSession, principal: Principal, organization: str | None, workspace: str | None
) -> Workspace:
    """The workspace named (by default the caller's own), if the caller may see it; another
    is answered as absent."""
    if organization is None:
        return await runs.workspace_for(session, principal, workspace)
    org = await organizations.organization_by_name(session, organization)
    if org.id != principal.organization_id:
        raise NotFound("ORGANIZATION_NOT_FOUND", f"No organisation named '{organization}'.")
    if workspace is None:
        return await runs.workspace_for(session, principal, None)
    hidden = NotFound("WORKSPACE_NOT_FOUND", f"No workspace named '{workspace}'.")
    try:
        ws = await organizations.workspace_by_name(session, org.id, workspace)
    except NotFound:
        raise hidden from None
    if not principal.can_see_workspace(ws.id, org.id):
        raise hidden
    return ws


async def last_id(session: AsyncSession, workspace_id: int) -> int:
    found = await session.scalar(
        select(func.max(Event.id)).where(Event.workspace_id == workspace_id)
    )
    return int(found or 0)


async def after(
    session: AsyncSession,
    workspace: Workspace,
    cursor: int,
    *,
    name: str | None = None,
    kind: str | None = None,
    limit: int = MAX_LIMIT,
    upto: int | None = None,
) -> list[EventView]:
    """The workspace's events after the id ``cursor`` (and up to ``upto``) visible now,
    oldest first."""
    query = _matching(
        select(Event).where(Event.workspace_id == workspace.id, Event.id > cursor), name, kind
    )
    if upto is not None:
        query = query.where(Event.id <= upto)
    rows = await session.scalars(query.order_by(Event.id).limit(limit))
    return [view(e, workspace.name) for e in rows]


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


def view(event: Event, workspace: str) -> EventView:
    data = dict(event.data or {})
    found = data.pop(FOUND_AT, None)
    return EventView(
        id=event.id,
        kind=shown_kind(event.kind, event.state),
        state=event.state,
        reason=event.reason,
        run=event.run_name,
        worker=event.worker_name,
        workspace=workspace,
        created_at=event.created_at,
        data=data,
        found_at=datetime.fromisoformat(found) if isinstance(found, str) else None,
    )
