"""``/tasks/<worker>/logs``: a worker's log, fetched from its machine (a *task*)."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backend.logs import service as logs
from backend.rest.base import Call, endpoint


async def get_logs(call: Call) -> Response:
    lines = logs.parse_tail(call.request.query_params.get("tail"))
    worker, machine_id = await logs.locate(
        call.session, call.principal, call.request.path_params["worker"]
    )
    await call.session.close()  # the machine may take seconds: hold no connection meanwhile
    source = getattr(call.request.app.state, "agents", None)
    found = await logs.fetch(source, machine_id, worker, lines)
    body: dict[str, object] = {"task_name": found.worker, "logs": found.text}
    if found.archived:
        body["archived"] = True
    return JSONResponse(body)


routes = [Route("/tasks/{worker}/logs", endpoint(get_logs), methods=["GET"])]
