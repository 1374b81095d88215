"""``/orgs/<org>/workspaces/<workspace>/events``: the workspace's events, newest first (seed
L-46: ``?name=<run>&limit=50``)."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backend.errors import InvalidInput
from backend.events import service as events
from backend.events.bell import bell_of
from backend.events.rules import parse_listing
from backend.rest.base import Call, endpoint


async def get_events(call: Call) -> Response:
    """``name`` (a run), ``limit`` (1 to 500, 50), ``before`` (an event id: the next page),
    ``kind`` (``run.state``, or ``run`` for every run event)."""
    query = call.request.query_params
    which, problems = parse_listing(
        query.get("name"), query.get("limit"), query.get("before"), query.get("kind")
    )
    if which is None:
        raise InvalidInput("INVALID_PARAMETER", problems)
    # up to the events bell's horizon: a reader that follows after the newest listed misses
    # none committed late below it (events.bell)
    horizon = await bell_of(call.request.app.state.db).settled()
    found, more = await events.listing(
        call.session,
        call.principal,
        call.request.path_params["org"],
        call.request.path_params["workspace"],
        which,
        horizon,
    )
    return JSONResponse({"events": [e.to_json() for e in found], "next_before": more})


routes = [Route("/orgs/{org}/workspaces/{workspace}/events", endpoint(get_events), methods=["GET"])]
