"""``GET /metrics``: the job queues as Prometheus text, for an organisation's admins (the
operators): each queue's depth, each actor's run time, wait, failures and folded asks, so a
backlog shows before it delays the tick (issue 19)."""

from __future__ import annotations

import asyncio

from starlette.responses import Response
from starlette.routing import Route

from backend.accounting.exposition import CONTENT_TYPE
from backend.errors import Forbidden
from backend.jobs import broker as job_broker
from backend.rest.base import Call, endpoint


async def get_queue_metrics(call: Call) -> Response:
    if not call.principal.is_org_admin:
        raise Forbidden("The job queues' metrics are for organisation admins.")
    return Response(await asyncio.to_thread(job_broker.queue_metrics), media_type=CONTENT_TYPE)


routes = [Route("/metrics", endpoint(get_queue_metrics), methods=["GET"])]
