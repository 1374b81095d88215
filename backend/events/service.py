"""The workspace's events, as the events API lists them: every state change of its runs and
workers with its reason, deletions, quota, alerts (seed L-43 … L-46)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.errors import NotFound
from backend.events import repository
from backend.events.rules import FOUND_AT, MAX_LIMIT, EventView, Listing, shown_kind
from backend.models import Event, Workspace
from backend.organizations import service as organizations


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
    rows = await repository.newest_first(
        session,
        ws.id,
        name=which.name,
        kind=which.kind,
        before=which.before,
        upto=upto,
        limit=which.limit + 1,
    )
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
        return await organizations.workspace_for(session, principal, workspace)
    org = await organizations.organization_by_name(session, organization)
    if org.id != principal.organization_id:
        raise NotFound("ORGANIZATION_NOT_FOUND", f"No organisation named '{organization}'.")
    if workspace is None:
        return await organizations.workspace_for(session, principal, None)
    hidden = NotFound("WORKSPACE_NOT_FOUND", f"No workspace named '{workspace}'.")
    try:
        ws = await organizations.workspace_by_name(session, org.id, workspace)
    except NotFound:
        raise hidden from None
    if not principal.can_see_workspace(ws.id, org.id):
        raise hidden
    return ws


async def last_id(session: AsyncSession, workspace_id: int) -> int:
    return await repository.last_id(session, workspace_id)


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
    rows = await repository.oldest_first_after(
        session, workspace.id, cursor, name=name, kind=kind, upto=upto, limit=limit
    )
    return [view(e, workspace.name) for e in rows]


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
