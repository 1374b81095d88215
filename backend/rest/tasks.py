"""``/tasks``: a run's workers (*tasks*) as the REST shim shows them, and a worker's log,
fetched from its machine (seed L-33, L-22, L-14 …)."""

from __future__ import annotations

from starlette.responses import Response
from starlette.routing import Route

from backend.clock import iso_z
from backend.errors import FieldError, InvalidInput
from backend.logs import service as logs
from backend.metrics import service as metrics
from backend.models import Run, Worker
from backend.rest import answers
from backend.rest.base import Call, endpoint
from backend.rest.parameters import JobQuery, LogPath, LogsQuery, TasksQuery, WorkerPath
from backend.runs import failures
from backend.runs import service as runs


def task_answer(
    run: Run, worker: Worker, machine: str | None, measured: metrics.Latest
) -> answers.Task:
    """status, exit_code, restarts, restart_at, last_failure (with its advice), placement and
    metrics."""
    placement = None
    if worker.machine_id is not None:
        placement = {"machine": machine, "gpu_ids": list(worker.gpu_ids or [])}
    return answers.Task.model_validate(
        {
            "name": worker.name,
            "job": run.name,
            "rank": worker.rank,
            "status": worker.state,
            "reason": worker.reason,
            "status_since": iso_z(worker.state_since),
            "gpus": worker.gpus,
            "exit_code": worker.exit_code,
            "restarts": worker.restarts,
            "restart_at": iso_z(worker.restart_at) if worker.restart_at else None,
            "last_failure": worker.last_failure,
            "advice": failures.worker_advice(worker),
            "placement": placement,
            "metrics": measured,
        }
    )


async def _tasks(call: Call, run: Run, workers: list[Worker]) -> list[answers.Task]:
    machine_ids = [w.machine_id for w in workers if w.machine_id is not None]
    names = await runs.machine_names(call.session, machine_ids)
    measured = await metrics.latest(call.session, [w.id for w in workers], call.clock.now())
    return [
        task_answer(
            run,
            w,
            names.get(w.machine_id) if w.machine_id is not None else None,
            measured.get(w.id, {}),
        )
        for w in workers
    ]


async def get_tasks(call: Call) -> Response:
    """``GET /tasks?job=<run>``: the run's workers, by rank."""
    q = TasksQuery.of(call.request)
    if not q.job:
        raise InvalidInput(
            "INVALID_PARAMETER", [FieldError("job", "is required: the run whose workers to list")]
        )
    run = await runs.get_run(call.session, call.principal, q.job, workspace=q.workspace)
    workers = (await runs.workers_by_run(call.session, [run.id])).get(run.id, [])
    return answers.Tasks(job=run.name, tasks=await _tasks(call, run, workers)).response()


async def get_task(call: Call) -> Response:
    """``GET /tasks/<worker>``: one worker, with its last failure snapshot."""
    workspace = JobQuery.of(call.request).workspace
    run, worker = await runs.get_worker(
        call.session, call.principal, WorkerPath.of(call.request).worker, workspace=workspace
    )
    return (await _tasks(call, run, [worker]))[0].response()


async def get_logs(call: Call) -> Response:
    lines = logs.parse_tail(LogsQuery.of(call.request).tail)
    worker, machine_id = await logs.locate(
        call.session, call.principal, LogPath.of(call.request).worker
    )
    await call.session.close()  # the machine may take seconds: hold no connection meanwhile
    source = getattr(call.request.app.state, "agents", None)
    found = await logs.fetch(source, machine_id, worker, lines)
    body: dict[str, object] = {"task_name": found.worker, "logs": found.text}
    if found.archived:
        body["archived"] = True
    return answers.Logs.model_validate(body).response()


routes = [
    Route("/tasks", endpoint(get_tasks), methods=["GET"]),
    Route("/tasks/{worker}", endpoint(get_task), methods=["GET"]),
    Route("/tasks/{worker}/logs", endpoint(get_logs), methods=["GET"]),
]
