"""The goodput endpoints of the seed (``/goodput``, ``/goodput/weekly``, ``/runs/<run>/goodput``,
``/organizations/<org>/clusters/<cluster>/goodput``) and the intervals behind a figure."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backend.accounting import service as accounting
from backend.accounting.exposition import CONTENT_TYPE
from backend.alerts import service as alerts
from backend.clock import iso_z
from backend.rest.base import Call, endpoint


async def get_goodput(call: Call) -> Response:
    """``GET /goodput?by=workspace|run|machine|pool&start=…&end=…`` (seed G-27, G-30, G-31)."""
    q = call.request.query_params
    viewer = await accounting.viewer_for(call.session, call.principal, q.get("workspace"))
    period = accounting.period_of(q.get("start"), q.get("end"), call.clock.now())
    found = await accounting.report(call.session, viewer, q.get("by"), period)
    return JSONResponse(found.to_json())


async def get_weekly(call: Call) -> Response:
    """``GET /goodput/weekly?weeks=8&by=run`` (seed G-28): ISO weeks, Monday, UTC."""
    q = call.request.query_params
    weeks = accounting.weeks_of(q.get("weeks"))
    viewer = await accounting.viewer_for(call.session, call.principal, q.get("workspace"))
    found = await accounting.weekly(call.session, viewer, q.get("by"), weeks, call.clock.now())
    return JSONResponse(
        {
            "by": found[0][1].by,
            "weeks": [{"week": week, **r.to_json()} for week, r in found],
        }
    )


async def get_run_goodput(call: Call) -> Response:
    """``GET /runs/<run>/goodput`` (seed G-29): the run's ledger since it was submitted."""
    name = call.request.path_params["run"]
    run, ledger = await accounting.run_ledger(
        call.session,
        call.principal,
        name,
        call.clock.now(),
        call.request.query_params.get("workspace"),
    )
    return JSONResponse({"run": run.name, "since": iso_z(run.created_at), **ledger.to_json()})


async def get_cluster_goodput(call: Call) -> Response:
    """``GET /organizations/<org>/clusters/<cluster>/goodput`` (seed G-34): every workspace's
    time on the cluster, for the organisation's admins."""
    p, q = call.request.path_params, call.request.query_params
    viewer = await accounting.cluster_viewer(call.session, call.principal, p["org"], p["cluster"])
    period = accounting.period_of(q.get("start"), q.get("end"), call.clock.now())
    found = await accounting.report(call.session, viewer, q.get("by"), period)
    return JSONResponse(found.to_json())


async def get_intervals(call: Call) -> Response:
    """``GET /goodput/intervals?by=run&name=llm&category=idle&start=…&end=…``: the worker
    intervals behind a ledger figure, earliest first (``limit``: 1 000, at most 10 000)."""
    q = call.request.query_params
    viewer = await accounting.viewer_for(call.session, call.principal, q.get("workspace"))
    period = accounting.period_of(q.get("start"), q.get("end"), call.clock.now())
    found = await accounting.explain(
        call.session,
        viewer,
        call.principal,
        by=q.get("by"),
        name=q.get("name"),
        category=q.get("category"),
        period=period,
        limit=accounting.interval_limit(q.get("limit")),
    )
    return JSONResponse({"intervals": [i.to_json() for i in found]})


async def get_metrics(call: Call) -> Response:
    """``GET /goodput/metrics`` (seed G-35 … G-43): Prometheus text exposition, scraped with
    the API token (an OpenTelemetry Collector's prometheus receiver works unchanged)."""
    firing = await alerts.firing_counts(call.session, call.principal)
    text = await accounting.exposition(call.session, call.principal, call.clock.now(), firing)
    return Response(text, media_type=CONTENT_TYPE)


routes = [
    Route("/goodput/metrics", endpoint(get_metrics), methods=["GET"]),
    Route("/goodput/intervals", endpoint(get_intervals), methods=["GET"]),
    Route("/goodput", endpoint(get_goodput), methods=["GET"]),
    Route("/goodput/weekly", endpoint(get_weekly), methods=["GET"]),
    Route("/runs/{run}/goodput", endpoint(get_run_goodput), methods=["GET"]),
    Route(
        "/organizations/{org}/clusters/{cluster}/goodput",
        endpoint(get_cluster_goodput),
        methods=["GET"],
    ),
]
