"""``/jobs/<run>``: a run as the REST shim shows it (a *job*)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.responses import Response
from starlette.routing import Route

from backend.clock import iso_z
from backend.code import service as code
from backend.models import Run, StateTransition, Worker
from backend.request.slurm_jobs import slurm_jobs
from backend.rest import answers
from backend.rest.base import Call, endpoint
from backend.rest.parameters import JobQuery, RunPath
from backend.runs import failures
from backend.runs import service as runs
from backend.runs.rules import task_counts
from backend.spec import stored_spec


def failure_json(run: Run, workers: list[Worker], now: datetime) -> dict[str, Any]:
    """Its failure (seed: Debug a failed run): the worker that failed it, the advice, and the
    Restarting in a loop panel's data, as GraphQL's failedWorker, advice and restartLoop."""
    worker = failures.failed_worker(run, workers) if run.state == "Failed" else None
    max_restarts = stored_spec(run.spec).max_restarts
    found = failures.run_advised(run, worker, max_restarts)
    loop = None
    restarts = failures.restarts_in_row(run.failures_in_row or 0, run.running_since, now)
    if restarts and run.state not in ("Completed", "Failed", "Stopped", "Deleted"):
        last = failures.last_snapshot(failures.snapshots_of(workers))
        snapshot = next((w.last_failure for w in workers if w.name == last), None)
        loop = {
            "restarts": restarts,
            "max_restarts": max_restarts,
            "restart_at": iso_z(run.restart_at) if run.restart_at else None,
            "worker": last,
            "last_failure": snapshot,
        }
    return {
        "failed_worker": worker.name if worker is not None else None,
        "advice": None if found is None else failures.advice_json(*found),
        "restart_loop": loop,
    }


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


async def _code(call: Call, run: Run) -> dict[str, Any] | None:
    digest = run.spec.get("code")
    if not digest:
        return None
    found = await code.archives_by_id(call.session, [run.code_id] if run.code_id else [])
    row = found.get(run.code_id) if run.code_id else None
    size, files = (row.size, row.files) if row is not None else (None, None)
    return {"digest": digest, "size": size, "files": files, "stored": row is not None}


async def get_job(call: Call) -> Response:
    name = RunPath.of(call.request).run
    workspace = JobQuery.of(call.request).workspace
    run = await runs.get_run(call.session, call.principal, name, workspace=workspace)
    workers = (await runs.workers_by_run(call.session, [run.id])).get(run.id, [])
    history = (await runs.history_by_run(call.session, [run.id])).get(run.id, [])
    creator = None
    if run.created_by_id is not None:
        creator = (await runs.user_names(call.session, [run.created_by_id])).get(run.created_by_id)
    slurm = (await slurm_jobs(call.session, [run.id])).get(run.id)
    body = job_json(run, workers, history, creator) | failure_json(run, workers, call.clock.now())
    body["slurm"] = slurm
    body["code"] = await _code(call, run)
    return answers.Job.model_validate(body).response()


routes = [Route("/jobs/{run}", endpoint(get_job), methods=["GET"])]
