"""The REST shim's OpenAPI document (3.1), served at ``/v1/openapi.json``, generated from the
models the routes use: the answers' schemas from ``answers`` (pydantic's JSON schema), the
parameters from ``parameters``. A test checks that it lists every route, and schemathesis
checks the server against it."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backend.rest import answers
from backend.rest import parameters as p

JSON = "application/json"
REF = "#/components/schemas/{model}"

ERRORS = {
    "400": "Bad input: each field and why.",
    "401": "No token, or not a valid one.",
    "404": "Not found, or not the caller's to see.",
}


@dataclass(frozen=True)
class Operation:
    """A GET of the shim: what it answers, with which parameters."""

    summary: str
    answer: type[BaseModel]
    said: str  # the 200 answer's description
    parameters: tuple[type[p.Parameters], ...] = ()
    more: dict[str, str] = field(default_factory=dict)  # other statuses, each an Error


OPERATIONS: dict[str, Operation] = {
    "/jobs/{run}": Operation(
        "A run (a job): status, history, task_counts and task_names (seed L-32).",
        answers.Job,
        "The run.",
        (p.RunPath, p.JobQuery),
    ),
    "/tasks": Operation(
        "A run's workers (tasks) with status, exit_code, restarts, restart_at, last_failure, "
        "placement and metrics (seed L-33).",
        answers.Tasks,
        "Its workers, by rank.",
        (p.TasksQuery,),
    ),
    "/tasks/{worker}": Operation(
        "A worker, with its last failure snapshot (seed L-22).",
        answers.Task,
        "The worker.",
        (p.WorkerPath, p.JobQuery),
    ),
    "/tasks/{worker}/logs": Operation(
        "A worker's log, fetched from its machine (seed L-13 … L-19).",
        answers.Logs,
        "The text, cut to its last 900 KiB.",
        (p.LogPath, p.LogsQuery),
        {"409": "TASK_NOT_PLACED: not placed yet, no log."},
    ),
    "/metrics/range": Operation(
        "One metric's series over time, of the workspace's workers (seed L-40 … L-42).",
        answers.MetricRange,
        "{metric, kind, unit, start, end, step, series: [{labels, points}]}.",
        (p.RangeQuery,),
    ),
    "/goodput": Operation(
        "A ledger per workspace, run, machine or pool over whole UTC hours (seed G-27).",
        answers.Report,
        "The ledgers, most held first, and their total.",
        (p.GoodputQuery,),
    ),
    "/goodput/weekly": Operation(
        "The last ISO weeks (Monday, UTC), this one included (seed G-28).",
        answers.Weekly,
        "A report per week.",
        (p.WeeklyQuery,),
    ),
    "/goodput/series": Operation(
        "Goodput over time: a ledger each hour or UTC day of whole UTC hours (issue 23).",
        answers.GoodputSeries,
        "The points, oldest first, and their total.",
        (p.SeriesQuery,),
        {"404": "NOT_FOUND: no run, machine, pool or workspace of that name."},
    ),
    "/goodput/cost": Operation(
        "The GPU time held on priced pools as money, by workspace or run (issue 23).",
        answers.CostReport,
        "A row each, most first, and their total; currency null: no pool has a price.",
        (p.GoodputQuery,),
    ),
    "/goodput/intervals": Operation(
        "The worker intervals behind a ledger figure, earliest first.",
        answers.Intervals,
        "The intervals.",
        (p.IntervalsQuery,),
    ),
    "/runs/{run}/goodput": Operation(
        "A run's own ledger since it was submitted (seed G-29).",
        answers.RunLedger,
        "Its ledger.",
        (p.RunPath, p.JobQuery),
    ),
    "/organizations/{org}/clusters/{cluster}/goodput": Operation(
        "Every workspace's time on a cluster, for the organisation's admins (seed G-34).",
        answers.Report,
        "The ledgers and their total.",
        (p.ClusterPath, p.ClusterGoodputQuery),
    ),
    "/code/{digest}": Operation(
        "A run's code as uploaded to the workspace (issue 41): its size and files.",
        answers.Code,
        "The archive (stored false: this call stored nothing).",
        (p.CodePath, p.JobQuery),
    ),
    "/orgs/{org}/workspaces/{workspace}/events": Operation(
        "The workspace's events, newest first (seed L-46).",
        answers.Events,
        "The events, and the id to ask the next page before (null: no more).",
        (p.WorkspacePath, p.EventsQuery),
    ),
}

# Not JSON: Prometheus text (backend.accounting.exposition).
PROMETHEUS = {
    "/goodput/metrics": {
        "get": {
            "summary": "Prometheus text exposition of the goodput gauges (seed G-35 … G-43).",
            "responses": {
                "200": {
                    "description": "Text exposition format 0.0.4.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": {
                    "description": ERRORS["401"],
                    "content": {JSON: {"schema": {"$ref": REF.format(model="Error")}}},
                },
            },
        }
    }
}


def _upload() -> dict[str, Any]:
    """PUT /code/{digest}: the archive as the body (astra astraeus submit --workdir uploads it)."""
    said = {
        "400": "INVALID_DIGEST, DIGEST_MISMATCH (the body's SHA-256 is another) or "
        "INVALID_ARCHIVE (not a gzip'd tar of files, folders and links inside it).",
        "401": ERRORS["401"],
        "404": ERRORS["404"],
        "413": "PAYLOAD_TOO_LARGE: over the server's limit for a run's code.",
        "429": "TOO_MANY_UPLOADS: the workspace is uploading others.",
    }
    return {
        "summary": "Upload a run's code: a gzip'd tar named by its SHA-256, stored once per "
        "workspace (issue 41).",
        "parameters": [x for group in (p.CodePath, p.JobQuery) for x in group.openapi()],
        "requestBody": {
            "required": True,
            # (the server reads the bytes whatever the type says)
            "content": {
                kind: {"schema": {"type": "string", "format": "binary"}}
                for kind in ("application/gzip", "application/octet-stream")
            },
        },
        "responses": {
            "200": _answer("The workspace had it already: nothing more stored.", answers.Code),
            "201": _answer("Stored.", answers.Code),
            **{status: _answer(text, answers.Error) for status, text in said.items()},
        },
    }


class _Components(GenerateJsonSchema):
    """Schemas as components: no titles derived from field names (a model keeps its own), and
    no ``additionalProperties: false``: the models (and the dataclasses they hold, such as a
    job's SlurmJob) refuse a field they do not declare when a body is made, but a client should
    accept a field added later."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: Any) -> Any:
        return _open(super().model_schema(schema))

    def dataclass_schema(self, schema: Any) -> Any:
        return _open(super().dataclass_schema(schema))


def _open(out: Any) -> Any:
    if out.get("additionalProperties") is False:
        del out["additionalProperties"]
    return out


def _answer(description: str, model: type[BaseModel]) -> dict[str, Any]:
    ref = {"$ref": REF.format(model=model.__name__)}
    return {"description": description, "content": {JSON: {"schema": ref}}}


def _operation(operation: Operation) -> dict[str, Any]:
    errors = ERRORS | operation.more
    return {
        "get": {
            "summary": operation.summary,
            "parameters": [x for group in operation.parameters for x in group.openapi()],
            "responses": {
                "200": _answer(operation.said, operation.answer),
                **{status: _answer(said, answers.Error) for status, said in errors.items()},
            },
        }
    }


@cache
def document() -> dict[str, Any]:
    models: set[type[BaseModel]] = {answers.Error, *(o.answer for o in OPERATIONS.values())}
    _, schemas = models_json_schema(
        [(m, "serialization") for m in sorted(models, key=lambda m: m.__name__)],
        ref_template=REF,
        schema_generator=_Components,
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Astraeus REST shim",
            "version": "1",
            "description": "Every curl line of the seeds works as written; GraphQL at /graphql "
            "is the primary interface. The same paths answer under /api/v1.",
        },
        "servers": [{"url": "/v1"}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas["$defs"],
        },
        "paths": {path: _operation(o) for path, o in OPERATIONS.items()}
        | PROMETHEUS
        | {"/code/{digest}": _operation(OPERATIONS["/code/{digest}"]) | {"put": _upload()}},
    }


async def get_openapi(request: Request) -> Response:
    return JSONResponse(document())


routes = [Route("/openapi.json", get_openapi, methods=["GET"])]
