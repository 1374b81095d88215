"""``/orgs/<org>/workspaces/<workspace>/events``: the workspace's events, newest first (seed
L-46: ``?name=<run>&limit=50``)."""

from __future__ import annotations

from functools import partial

from starlette.responses import Response
from starlette.routing import Route

from backend import ids
from backend.errors import InvalidInput
from backend.events import service as events
from backend.events.bell import bell_of
from backend.events.rules import parse_listing
from backend.rest.answers import Events
from backend.rest.base import Call, endpoint
from backend.rest.parameters import EventsQuery, WorkspacePath


async def get_events(call: Call) -> Response:
    """``name`` (a run), ``limit`` (1 to 500, 50), ``before`` (an event's id or a page's
    ``next_before``: the next page),
    ``kind`` (``run.state``, or ``run`` for every run event)."""
    q = EventsQuery.of(call.request)
    db = call.request.app.state.db
    codec = await ids.codec(db)
    opened = partial(codec.open, ids.Kind.EVENT)
    which, problems = parse_listing(q.name, q.limit, q.before, q.kind, opened)
    if which is None:
        raise InvalidInput("INVALID_PARAMETER", problems)
    # up to the events bell's horizon: a reader that follows after the newest listed misses
    # none committed late below it (events.bell)
    horizon = await bell_of(db).settled()
    where = WorkspacePath.of(call.request)
    found, more = await events.listing(
        call.session, call.principal, where.org, where.workspace, which, horizon
    )
    body = {
        "events": [e.to_json(codec.show(ids.Kind.EVENT, e.id)) for e in found],
        "next_before": None if more is None else codec.show(ids.Kind.EVENT, more),
    }
    return Events.model_validate(body).response()


routes = [Route("/orgs/{org}/workspaces/{workspace}/events", endpoint(get_events), methods=["GET"])]
