"""``/metrics/range``: one metric's series over time, of the workspace's workers only."""

from __future__ import annotations

from starlette.responses import Response
from starlette.routing import Route

from backend.config import Settings
from backend.metrics import service as metrics
from backend.metrics.service import RangeParams
from backend.rest.answers import MetricRange
from backend.rest.base import Call, endpoint
from backend.rest.parameters import RangeQuery


async def get_range(call: Call) -> Response:
    q = RangeQuery.of(call.request)
    params = RangeParams(
        metric=q.metric,
        match=q.match,
        by=q.by,
        agg=q.agg,
        rate=q.rate,
        start=q.start,
        end=q.end,
        step=q.step,
    )
    settings: Settings = call.request.app.state.settings
    answer = await metrics.range_query(
        call.session,
        call.principal,
        params,
        now=call.clock.now(),
        retention=settings.metrics_retention,
        workspace=q.workspace,
    )
    return MetricRange.model_validate(answer.to_json()).response()


routes = [Route("/metrics/range", endpoint(get_range), methods=["GET"])]
