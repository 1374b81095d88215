"""Metric series in GraphQL, as GET /v1/metrics/range answers them (seed L-40 … L-42)."""

from __future__ import annotations

from backend.metrics import service as metrics
from backend.metrics.rules import RangeParams
from backend.request.context import Info
from backend.schema.events import MetricRange, MetricSeries


async def metric_range(
    info: Info,
    metric: str,
    match: list[str] | None = None,
    by: str | None = None,
    agg: str | None = None,
    rate: bool = False,
    start: str | None = None,
    end: str | None = None,
    step: str | None = None,
    workspace: str | None = None,
) -> MetricRange:
    """One metric's series over time, of the workspace's workers (as /v1/metrics/range)."""
    principal = info.context.require_principal()
    params = RangeParams(metric, match or (), by, agg, "true" if rate else None, start, end, step)
    async with info.context.db.read() as session:
        answer = await metrics.range_query(
            session,
            principal,
            params,
            now=info.context.clock.now(),
            retention=info.context.metrics_retention,
            workspace=workspace,
        )
    body = answer.to_json()
    return MetricRange(
        metric=body["metric"],
        kind=body["kind"],
        unit=body["unit"],
        start=body["start"],
        end=body["end"],
        step=body["step"],
        series=[
            MetricSeries(labels=s["labels"], points=[[float(t), v] for t, v in s["points"]])
            for s in body["series"]
        ],
        unmeasured=body["unmeasured"],
        not_measured=body["not_measured"],
    )
