"""The workspace's events, as the events API lists them: every state change of its runs and
workers with its reason, deletions, quota, alerts (seed L-43 … L-46)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.errors import NotFound
from backend.events.rules import EventView, Listing
from backend.models import Event
from backend.organizations import service as organizations


async def listing(
    session: AsyncSession, principal: Principal, organization: str, workspace: str, which: Listing
) -> tuple[list[EventView], int | None]:
    """The events, newest first, and the id to ask the next page ``before`` (None: no more).
    A workspace the caller may not see is answered as absent."""
    org = await organizations.organization_by_name(session, organization)
    hidden = NotFound("WORKSPACE_NOT_FOUND", f"No workspace named '{workspace}'.")
    if org.id != principal.organization_id:
        raise NotFound("ORGANIZATION_NOT_FOUND", f"No organisation named '{organization}'.")
    try:
        ws = await organizations.workspace_by_name(session, org.id, workspace)
    except NotFound:
        raise hidden from None
    if not principal.can_see_workspace(ws.id, org.id):
        raise hidden
    query = select(Event).where(Event.workspace_id == ws.id)
    if which.name is not None:
        query = query.where(Event.run_name == which.name)
    if which.before is not None:
        query = query.where(Event.id < which.before)
    if which.kind is not None:
        query = query.where((Event.kind == which.kind) | Event.kind.startswith(which.kind + "."))
    rows = list(await session.scalars(query.order_by(Event.id.desc()).limit(which.limit + 1)))
    more = len(rows) > which.limit
    rows = rows[: which.limit]
    views = [view(e, ws.name) for e in rows]
    return views, (rows[-1].id if more and rows else None)


def view(event: Event, workspace: str) -> EventView:
    return EventView(
        id=event.id,
        kind=event.kind,
        state=event.state,
        reason=event.reason,
        run=event.run_name,
        worker=event.worker_name,
        workspace=workspace,
        created_at=event.created_at,
        data=dict(event.data or {}),
    )
