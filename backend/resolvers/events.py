"""Events and logs in GraphQL: a page of the workspace's events; subscriptions
(graphql-transport-ws) to a worker's log as it is written and to the events as they happen."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from functools import partial

import strawberry

from backend import ids
from backend.errors import FieldError, InvalidInput
from backend.events import service as events
from backend.events.bell import bell_of
from backend.events.rules import MAX_LIMIT, parse_listing
from backend.logs import service as logs
from backend.request.context import Info
from backend.resolvers.streams import while_token_holds
from backend.schema.events import Event, EventPage, LogChunk

AFTER_PROBLEM = "must be an event id as the API gave it (an event's id)"


async def follow_log(
    info: Info, worker: str, tail: int = 0, workspace: str | None = None
) -> AsyncGenerator[LogChunk, None]:
    """A worker's new log lines (a run's name: its first worker; a failed run's, the worker that
    failed it) as its machine writes them, beginning with its last ``tail`` lines, until it
    ends (or its token is revoked)."""
    async for chunk in while_token_holds(info, _follow_log(info, worker, tail, workspace)):
        yield chunk


async def _follow_log(
    info: Info, worker: str, tail: int, workspace: str | None
) -> AsyncGenerator[LogChunk, None]:
    principal = info.context.require_principal()
    lines = logs.parse_follow_tail(tail)
    async with info.context.db.read() as session:
        name, machine_id = await logs.locate(session, principal, worker, workspace=workspace)
    async for chunk in logs.follow(info.context.logs, machine_id, name, lines):
        yield LogChunk(
            text=chunk.text,
            archived=chunk.archived,
            missed=chunk.missed,
            ended=chunk.ended,
            behind=chunk.behind,
        )


async def events_feed(
    info: Info,
    organization: str | None = None,
    workspace: str | None = None,
    name: str | None = None,
    kind: str | None = None,
    after: strawberry.ID | None = None,
) -> AsyncGenerator[Event, None]:
    """The workspace's events from now on (or after the id ``after``), oldest first, as they
    happen: of one run (``name``) or kind (``run.state``; ``run``: every run event), until the
    token is revoked or expires."""
    source = _events_feed(info, organization, workspace, name, kind, after)
    async for event in while_token_holds(info, source):
        yield event


async def _events_feed(
    info: Info,
    organization: str | None,
    workspace: str | None,
    name: str | None,
    kind: str | None,
    after: strawberry.ID | None,
) -> AsyncGenerator[Event, None]:
    principal = info.context.require_principal()
    codec = await ids.codec(info.context.db)
    start = None if after is None else codec.open(ids.Kind.EVENT, after)
    if after is not None and start is None:
        raise InvalidInput("INVALID_PARAMETER", [FieldError("after", AFTER_PROBLEM)])
    async with info.context.db.read() as session:
        target = await events.workspace_of(session, principal, organization, workspace)
    # Ids are taken when events are written, and a transaction may commit after one that took
    # a larger id: only the events up to the bell's horizon are handed on, in id order, those
    # below it that will ever be visible being visible (events.bell). Each is handed once, and
    # a client resuming after the last id it got misses none.
    bell = bell_of(info.context.db)  # one look a second for all subscribers of this process
    async with bell.listening():
        horizon = await bell.settled()
        cursor = start if start is not None else horizon
        while True:
            rings = bell.rings
            horizon = bell.horizon
            if horizon <= cursor:
                await bell.wait(rings)
                continue
            async with info.context.db.read() as session:
                found = await events.after(
                    session, target, cursor, name=name, kind=kind, limit=MAX_LIMIT, upto=horizon
                )
            for view in found:
                yield Event.of(view, codec.show(ids.Kind.EVENT, view.id))
            cursor = found[-1].id if len(found) == MAX_LIMIT else horizon


async def events_page(
    info: Info,
    organization: str | None = None,
    workspace: str | None = None,
    name: str | None = None,
    kind: str | None = None,
    limit: int = 50,
    before: strawberry.ID | None = None,
) -> EventPage:
    """The workspace's events, newest first (seed L-44, L-46)."""
    principal = info.context.require_principal()
    codec = await ids.codec(info.context.db)
    opened = partial(codec.open, ids.Kind.EVENT)
    which, problems = parse_listing(name, str(limit), before, kind, opened)
    if which is None:
        raise InvalidInput("INVALID_PARAMETER", problems)
    horizon = await bell_of(info.context.db).settled()  # none a follower would miss
    async with info.context.db.read() as session:
        target = await events.workspace_of(session, principal, organization, workspace)
        found, more = await events.page(session, target, which, horizon)
    return EventPage(
        events=[Event.of(v, codec.show(ids.Kind.EVENT, v.id)) for v in found],
        next_before=None if more is None else strawberry.ID(codec.show(ids.Kind.EVENT, more)),
    )
