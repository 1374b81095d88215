"""``/jobs/<run>``: a run as the REST shim shows it (a *job*)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backend.clock import iso_z
from backend.models import Run, StateTransition, Worker
from backend.rest.base import Call, endpoint
from backend.runs import service as runs
from backend.runs.rules import task_counts


def job_json(
    run: Run, workers: list[Worker], history: list[StateTransition], created_by: str | None
) -> dict[str, Any]:
    return {
        "name": run.name,
        "status": run.state,
        "reason": run.reason,
        "priority": run.priority,
        "created_at": iso_z(run.created_at),
        "created_by": created_by,
        "ended_at": iso_z(run.ended_at) if run.ended_at else None,
        "history": [
            {"transition_at": iso_z(h.transition_at), "state": h.state, "reason": h.reason}
            for h in history
        ],
        "task_counts": task_counts(w.state for w in workers),
        "task_names": [w.name for w in workers],
        "spec": run.spec,
    }


async def get_job(call: Call) -> Response:
    name = call.request.path_params["run"]
    workspace = call.request.query_params.get("workspace")
    run = await runs.get_run(call.session, call.principal, name, workspace=workspace)
    workers = (await runs.workers_by_run(call.session, [run.id])).get(run.id, [])
    history = (await runs.history_by_run(call.session, [run.id])).get(run.id, [])
    creator = None
    if run.created_by_id is not None:
        creator = (await runs.user_names(call.session, [run.created_by_id])).get(run.created_by_id)
    return JSONResponse(job_json(run, workers, history, creator))


routes = [Route("/jobs/{run}", endpoint(get_job), methods=["GET"])]
