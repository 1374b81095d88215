"""``/metrics/range``: one metric's series over time, of the workspace's workers only."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backend.config import Settings
from backend.metrics import service as metrics
from backend.metrics.service import RangeParams
from backend.rest.base import Call, endpoint


async def get_range(call: Call) -> Response:
    query = call.request.query_params
    params = RangeParams(
        metric=query.get("metric"),
        match=query.getlist("match"),
        by=query.get("by"),
        agg=query.get("agg"),
        rate=query.get("rate"),
        start=query.get("start"),
        end=query.get("end"),
        step=query.get("step"),
    )
    settings: Settings = call.request.app.state.settings
    answer = await metrics.range_query(
        call.session,
        call.principal,
        params,
        now=call.clock.now(),
        retention=settings.metrics_retention,
        workspace=query.get("workspace"),
    )
    return JSONResponse(answer.to_json())


routes = [Route("/metrics/range", endpoint(get_range), methods=["GET"])]
