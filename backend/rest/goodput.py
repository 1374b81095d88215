"""The goodput endpoints of the seed (``/goodput``, ``/goodput/weekly``, ``/runs/<run>/goodput``,
``/organizations/<org>/clusters/<cluster>/goodput``) and the intervals behind a figure."""

from __future__ import annotations

from starlette.responses import Response
from starlette.routing import Route

from backend.accounting import (
    costs,
    explain,
    prometheus,
    reports,
    rework,
    run_goodput,
    series,
    viewers,
)
from backend.accounting.exposition import CONTENT_TYPE
from backend.alerts import service as alerts
from backend.clock import iso_z
from backend.rest import answers
from backend.rest.base import Call, endpoint
from backend.rest.parameters import (
    ClusterGoodputQuery,
    ClusterPath,
    GoodputQuery,
    IntervalsQuery,
    JobQuery,
    RunPath,
    SeriesQuery,
    WeeklyQuery,
)


async def get_goodput(call: Call) -> Response:
    """``GET /goodput?by=workspace|run|machine|pool&start=…&end=…`` (seed G-27, G-30, G-31)."""
    q = GoodputQuery.of(call.request)
    viewer = await viewers.viewer_for(call.session, call.principal, q.workspace)
    period = viewers.period_of(q.start, q.end, call.clock.now())
    found = await reports.report(call.session, viewer, q.by, period)
    return answers.Report.model_validate(found.to_json()).response()


async def get_weekly(call: Call) -> Response:
    """``GET /goodput/weekly?weeks=8&by=run`` (seed G-28): ISO weeks, Monday, UTC."""
    q = WeeklyQuery.of(call.request)
    weeks = reports.weeks_of(q.weeks)
    viewer = await viewers.viewer_for(call.session, call.principal, q.workspace)
    found = await reports.weekly(call.session, viewer, q.by, weeks, call.clock.now())
    return answers.Weekly.model_validate(
        {"by": found[0][1].by, "weeks": [{"week": week, **r.to_json()} for week, r in found]}
    ).response()


async def get_run_goodput(call: Call) -> Response:
    """``GET /runs/<run>/goodput`` (seed G-29): the run's ledger since it was submitted."""
    run, ledger = await run_goodput.run_ledger(
        call.session,
        call.principal,
        RunPath.of(call.request).run,
        call.clock.now(),
        JobQuery.of(call.request).workspace,
    )
    ettr = await run_goodput.run_ettrs(call.session, [run_goodput.run_clock(run)], call.clock.now())
    run_rework = await rework.run_rework(call.session, run, call.clock.now())
    return answers.RunLedger.model_validate(
        {
            "run": run.name,
            "since": iso_z(run.created_at),
            "ettr": ettr[run.id],
            "rework": run_rework.to_json(),
            **ledger.to_json(),
        }
    ).response()


async def get_cluster_goodput(call: Call) -> Response:
    """``GET /organizations/<org>/clusters/<cluster>/goodput`` (seed G-34): every workspace's
    time on the cluster, for the organisation's admins."""
    p, q = ClusterPath.of(call.request), ClusterGoodputQuery.of(call.request)
    viewer = await viewers.cluster_viewer(call.session, call.principal, p.org, p.cluster)
    period = viewers.period_of(q.start, q.end, call.clock.now())
    found = await reports.report(call.session, viewer, q.by, period)
    return answers.Report.model_validate(found.to_json()).response()


async def get_series(call: Call) -> Response:
    """``GET /goodput/series?by=run&name=llm&step=hour|day&start=…&end=…``: goodput over
    time, one ledger a point; without ``name``, every row the caller reads, summed."""
    q = SeriesQuery.of(call.request)
    viewer = await viewers.viewer_for(call.session, call.principal, q.workspace)
    period = viewers.period_of(q.start, q.end, call.clock.now())
    found = await series.series(
        call.session, viewer, call.principal, by=q.by, name=q.name, step=q.step, period=period
    )
    return answers.GoodputSeries.model_validate(found.to_json()).response()


async def get_cost(call: Call) -> Response:
    """``GET /goodput/cost?by=workspace|run&start=…&end=…``: the GPU time held on priced pools
    as money (each pool's price per GPU-hour, set by the organisation's admins)."""
    q = GoodputQuery.of(call.request)
    viewer = await viewers.viewer_for(call.session, call.principal, q.workspace)
    period = viewers.period_of(q.start, q.end, call.clock.now())
    found = await costs.costs(call.session, viewer, call.principal.organization_id, q.by, period)
    return answers.CostReport.model_validate(found.to_json()).response()


async def get_intervals(call: Call) -> Response:
    """``GET /goodput/intervals?by=run&name=llm&category=idle&start=…&end=…``: the worker
    intervals behind a ledger figure, earliest first (``limit``: 1 000, at most 10 000)."""
    q = IntervalsQuery.of(call.request)
    viewer = await viewers.viewer_for(call.session, call.principal, q.workspace)
    period = viewers.period_of(q.start, q.end, call.clock.now())
    found = await explain.explain(
        call.session,
        viewer,
        call.principal,
        by=q.by,
        name=q.name,
        category=q.category,
        period=period,
        limit=explain.interval_limit(q.limit),
    )
    return answers.Intervals.model_validate({"intervals": [i.to_json() for i in found]}).response()


async def get_metrics(call: Call) -> Response:
    """``GET /goodput/metrics`` (seed G-35 … G-43): Prometheus text exposition, scraped with
    the API token (an OpenTelemetry Collector's prometheus receiver works unchanged)."""
    firing = await alerts.firing_counts(call.session, call.principal)
    text = await prometheus.exposition(call.session, call.principal, call.clock.now(), firing)
    return Response(text, media_type=CONTENT_TYPE)


routes = [
    Route("/goodput/metrics", endpoint(get_metrics), methods=["GET"]),
    Route("/goodput/intervals", endpoint(get_intervals), methods=["GET"]),
    Route("/goodput/series", endpoint(get_series), methods=["GET"]),
    Route("/goodput/cost", endpoint(get_cost), methods=["GET"]),
    Route("/goodput", endpoint(get_goodput), methods=["GET"]),
    Route("/goodput/weekly", endpoint(get_weekly), methods=["GET"]),
    Route("/runs/{run}/goodput", endpoint(get_run_goodput), methods=["GET"]),
    Route(
        "/organizations/{org}/clusters/{cluster}/goodput",
        endpoint(get_cluster_goodput),
        methods=["GET"],
    ),
]
