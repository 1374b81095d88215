"""The REST shim's OpenAPI document (3.1), served at ``/v1/openapi.json``: every endpoint of
the seeds, its parameters and answers. A test checks that it lists every route, and
schemathesis checks the server against it."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backend.accounting.rules import CATEGORIES, MAX_WEEKS
from backend.metrics.rules import CATALOGUE

JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _query(
    name: str, description: str, schema: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "description": description,
        "schema": schema or {"type": "string"},
        **extra,
    }


def _path(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "minLength": 1},
    }


def _answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


ERRORS = {
    "400": _answer("Bad input: each field and why.", _ref("Error")),
    "401": _answer("No token, or not a valid one.", _ref("Error")),
    "404": _answer("Not found, or not the caller's to see.", _ref("Error")),
}

WORKSPACE = _query(
    "workspace", "A workspace of the caller's organisation (its admins); the token's by default."
)
PERIOD = [
    _query("start", "RFC 3339 or Unix time; 7 days before end by default."),
    _query("end", "RFC 3339 or Unix time; now by default. A period is at most 400 days."),
]
BY = _query(
    "by",
    "A row per workspace (default), run, machine or pool.",
    {"type": "string", "enum": ["workspace", "run", "machine", "pool"]},
)


def _get(summary: str, parameters: list[dict[str, Any]], ok: dict[str, Any], **more: Any) -> Any:
    return {
        "get": {
            "summary": summary,
            "parameters": parameters,
            "responses": {"200": ok, **ERRORS, **more},
        }
    }


def _ledger() -> dict[str, Any]:
    hours = {
        "type": "object",
        "properties": {c.value: {"type": "number"} for c in CATEGORIES},
        "required": [c.value for c in CATEGORIES],
    }
    return {
        "type": "object",
        "description": "GPU-hours by category; goodput is absent when nothing was held.",
        "properties": {
            "gpu_hours": hours,
            "held_gpu_hours": hours,
            "allocated_gpu_hours": {"type": "number"},
            "productive_gpu_hours": {"type": "number"},
            "lost_gpu_hours": {"type": "number"},
            "waiting_gpu_hours": {"type": "number"},
            "goodput": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": [
            "gpu_hours",
            "held_gpu_hours",
            "allocated_gpu_hours",
            "productive_gpu_hours",
            "lost_gpu_hours",
            "waiting_gpu_hours",
        ],
    }


NULLABLE_STRING = {"type": ["string", "null"]}
NULLABLE_INT = {"type": ["integer", "null"]}
TIME = {"type": "string", "format": "date-time"}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "message": {"type": "string"},
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"field": {"type": "string"}, "reason": {"type": "string"}},
                    "required": ["field", "reason"],
                },
            },
        },
        "required": ["code", "message"],
    },
    "Job": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "status": {"type": "string"},
            "reason": {"type": "string"},
            "priority": {"type": "integer"},
            "created_at": TIME,
            "created_by": NULLABLE_STRING,
            "ended_at": {"type": ["string", "null"], "format": "date-time"},
            "history": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "transition_at": TIME,
                        "state": {"type": "string"},
                        "reason": {"type": "string"},
                    },
                    "required": ["transition_at", "state", "reason"],
                },
            },
            "task_counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "task_names": {"type": "array", "items": {"type": "string"}},
            "spec": {"type": "object"},
            "failed_worker": {
                **NULLABLE_STRING,
                "description": "The worker that failed the run, while it is Failed.",
            },
            "advice": {
                "oneOf": [{"type": "null"}, _ref("Advice")],
                "description": "Its failure turned into the seed's advice (a Failed run, one "
                "restarting after a failure or a stall, a preempted one until it runs again).",
            },
            "restart_loop": {
                "type": ["object", "null"],
                "description": "The Restarting in a loop panel: restarts in a row, when the "
                "next attempt is, the worker of the last failure and its snapshot.",
                "properties": {
                    "restarts": {"type": "integer"},
                    "max_restarts": {"type": "integer"},
                    "restart_at": {"type": ["string", "null"], "format": "date-time"},
                    "worker": NULLABLE_STRING,
                    "last_failure": {"type": ["object", "null"]},
                },
            },
        },
        "required": ["name", "status", "reason", "history", "task_counts", "task_names"],
    },
    "Advice": {
        "type": "object",
        "properties": {
            "reason": {"type": "string"},
            "exit_code": NULLABLE_INT,
            "kind": {"type": "string"},
            "look_at": {"type": "string", "description": "The seed's Look at sentence."},
            "open": {"type": "string"},
        },
        "required": ["reason", "exit_code", "kind", "look_at", "open"],
    },
    "Task": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "job": {"type": "string"},
            "rank": {"type": "integer"},
            "status": {"type": "string"},
            "reason": {"type": "string"},
            "status_since": TIME,
            "gpus": {"type": "integer"},
            "exit_code": NULLABLE_INT,
            "restarts": {"type": "integer"},
            "restart_at": {"type": ["string", "null"], "format": "date-time"},
            "last_failure": {
                "type": ["object", "null"],
                "properties": {
                    "reason": {"type": "string"},
                    "failed_at": {"type": "string"},
                    "exit_code": NULLABLE_INT,
                    "log_tail": {"type": "string"},
                },
            },
            "advice": {
                "oneOf": [{"type": "null"}, _ref("Advice")],
                "description": "Its failure (its own end, else its last) turned into advice.",
            },
            "placement": {
                "type": ["object", "null"],
                "properties": {
                    "machine": NULLABLE_STRING,
                    "gpu_ids": {"type": "array", "items": {"type": "integer"}},
                },
            },
            "metrics": {
                "type": "object",
                "description": "Each metric's newest value of the last two minutes; per GPU "
                "(by index) where the seed measures GPUs.",
                "additionalProperties": {
                    "oneOf": [
                        {"type": "number"},
                        {"type": "object", "additionalProperties": {"type": "number"}},
                    ]
                },
            },
        },
        "required": [
            "name",
            "status",
            "exit_code",
            "restarts",
            "restart_at",
            "last_failure",
            "placement",
            "metrics",
        ],
    },
    "Ledger": _ledger(),
    "Report": {
        "type": "object",
        "properties": {
            "by": {"type": "string"},
            "start": TIME,
            "end": TIME,
            "ledgers": {
                "type": "array",
                "items": {
                    "allOf": [
                        _ref("Ledger"),
                        {"type": "object", "properties": {"name": {"type": "string"}}},
                    ]
                },
            },
            "total": _ref("Ledger"),
        },
        "required": ["by", "start", "end", "ledgers", "total"],
    },
    "Event": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "kind": {"type": "string"},
            "state": NULLABLE_STRING,
            "reason": {"type": "string"},
            "run": NULLABLE_STRING,
            "worker": NULLABLE_STRING,
            "workspace": {"type": "string"},
            "created_at": {**TIME, "description": "When it happened (a stall: its start)."},
            "found_at": {
                **TIME,
                "description": "When it was found; events are listed in this order (by id).",
            },
            "data": {"type": "object"},
        },
        "required": ["id", "kind", "reason", "workspace", "created_at", "found_at"],
    },
}


def document() -> dict[str, Any]:
    metric_names = [m.name for m in CATALOGUE]
    paths: dict[str, Any] = {
        "/jobs/{run}": _get(
            "A run (a job): status, history, task_counts and task_names (seed L-32).",
            [_path("run", "The run's name."), WORKSPACE],
            _answer("The run.", _ref("Job")),
        ),
        "/tasks": _get(
            "A run's workers (tasks) with status, exit_code, restarts, restart_at, "
            "last_failure, placement and metrics (seed L-33).",
            [
                _query("job", "The run.", {"type": "string", "minLength": 1}, required=True),
                WORKSPACE,
            ],
            _answer(
                "Its workers, by rank.",
                {
                    "type": "object",
                    "properties": {
                        "job": {"type": "string"},
                        "tasks": {"type": "array", "items": _ref("Task")},
                    },
                    "required": ["job", "tasks"],
                },
            ),
        ),
        "/tasks/{worker}": _get(
            "A worker, with its last failure snapshot (seed L-22).",
            [_path("worker", "The worker's name, <run>-<rank>."), WORKSPACE],
            _answer("The worker.", _ref("Task")),
        ),
        "/tasks/{worker}/logs": _get(
            "A worker's log, fetched from its machine (seed L-13 … L-19).",
            [
                _path("worker", "The worker (a run's name: its first worker)."),
                _query(
                    "tail",
                    "The last lines: 1 000 by default, at most 10 000.",
                    {"type": "integer", "minimum": 1, "maximum": 10_000},
                ),
            ],
            _answer(
                "The text, cut to its last 900 KiB.",
                {
                    "type": "object",
                    "properties": {
                        "task_name": {"type": "string"},
                        "logs": {"type": "string"},
                        "archived": {"type": "boolean"},
                    },
                    "required": ["task_name", "logs"],
                },
            ),
            **{"409": _answer("TASK_NOT_PLACED: not placed yet, no log.", _ref("Error"))},
        ),
        "/metrics/range": _get(
            "One metric's series over time, of the workspace's workers (seed L-40 … L-42).",
            [
                _query(
                    "metric",
                    "The metric.",
                    {"type": "string", "enum": metric_names},
                    required=True,
                ),
                _query(
                    "match",
                    "label:value, repeatable (run, worker, machine, gpu).",
                    {"type": "array", "items": {"type": "string"}},
                    style="form",
                    explode=True,
                ),
                _query("by", "Labels to group by, comma-separated."),
                _query(
                    "agg",
                    "How series are combined.",
                    {"type": "string", "enum": ["sum", "avg", "max", "min"]},
                ),
                _query("rate", "Per-second rate of a counter.", {"type": "boolean"}),
                *PERIOD,
                _query("step", "Seconds between points, or a duration (30s, 5m); automatic."),
                WORKSPACE,
            ],
            _answer(
                "{metric, kind, unit, start, end, step, series: [{labels, points}]}.",
                {
                    "type": "object",
                    "properties": {
                        "metric": {"type": "string"},
                        "kind": {"type": "string"},
                        "unit": {"type": "string"},
                        "start": {"type": "integer"},
                        "end": {"type": "integer"},
                        "step": {"type": "integer"},
                        "series": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "labels": {"type": "object"},
                                    "points": {
                                        "type": "array",
                                        "items": {
                                            "type": "array",
                                            "description": "[time in ms, value]",
                                            "items": {"type": "number"},
                                            "minItems": 2,
                                            "maxItems": 2,
                                        },
                                    },
                                },
                            },
                        },
                        "unmeasured": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "The workers whose machine's agent does not measure "
                            "this metric (e.g. network bytes where workers share the host's "
                            "network).",
                        },
                        "not_measured": {
                            "type": ["string", "null"],
                            "description": 'Why, as the console says it ("Not measured: this '
                            "machine's agent runs processes on the host's network\"); null when "
                            "every worker's machine measures it.",
                        },
                    },
                    "required": ["metric", "kind", "unit", "start", "end", "step", "series"],
                },
            ),
        ),
        "/goodput": _get(
            "A ledger per workspace, run, machine or pool over whole UTC hours (seed G-27).",
            [BY, *PERIOD, WORKSPACE],
            _answer("The ledgers, most held first, and their total.", _ref("Report")),
        ),
        "/goodput/weekly": _get(
            "The last ISO weeks (Monday, UTC), this one included (seed G-28).",
            [
                _query(
                    "weeks",
                    "How many: 8 by default.",
                    {"type": "integer", "minimum": 1, "maximum": MAX_WEEKS},
                ),
                BY,
                WORKSPACE,
            ],
            _answer(
                "A report per week.",
                {
                    "type": "object",
                    "properties": {
                        "by": {"type": "string"},
                        "weeks": {
                            "type": "array",
                            "items": {
                                "allOf": [
                                    _ref("Report"),
                                    {"type": "object", "properties": {"week": {"type": "string"}}},
                                ]
                            },
                        },
                    },
                    "required": ["by", "weeks"],
                },
            ),
        ),
        "/goodput/intervals": _get(
            "The worker intervals behind a ledger figure, earliest first.",
            [
                BY,
                _query("name", "The run, machine, pool or workspace.", required=True),
                _query(
                    "category",
                    "One category.",
                    {"type": "string", "enum": [c.value for c in CATEGORIES]},
                ),
                *PERIOD,
                _query(
                    "limit",
                    "At most this many: 1 000 by default.",
                    {"type": "integer", "minimum": 1, "maximum": 10_000},
                ),
                WORKSPACE,
            ],
            _answer(
                "The intervals.",
                {
                    "type": "object",
                    "properties": {"intervals": {"type": "array", "items": {"type": "object"}}},
                    "required": ["intervals"],
                },
            ),
        ),
        "/goodput/metrics": {
            "get": {
                "summary": "Prometheus text exposition of the goodput gauges (seed G-35 … G-43).",
                "responses": {
                    "200": {
                        "description": "Text exposition format 0.0.4.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": ERRORS["401"],
                },
            }
        },
        "/runs/{run}/goodput": _get(
            "A run's own ledger since it was submitted (seed G-29).",
            [_path("run", "The run's name."), WORKSPACE],
            _answer(
                "Its ledger.",
                {
                    "allOf": [
                        _ref("Ledger"),
                        {
                            "type": "object",
                            "properties": {"run": {"type": "string"}, "since": TIME},
                        },
                    ]
                },
            ),
        ),
        "/organizations/{org}/clusters/{cluster}/goodput": _get(
            "Every workspace's time on a cluster, for the organisation's admins (seed G-34).",
            [_path("org", "The organisation."), _path("cluster", "The cluster."), BY, *PERIOD],
            _answer("The ledgers and their total.", _ref("Report")),
        ),
        "/orgs/{org}/workspaces/{workspace}/events": _get(
            "The workspace's events, newest first (seed L-46).",
            [
                _path("org", "The organisation."),
                _path("workspace", "The workspace."),
                _query("name", "Of one run."),
                _query(
                    "limit",
                    "At most this many: 50 by default.",
                    {"type": "integer", "minimum": 1, "maximum": 500},
                ),
                _query("before", "The next page: events before this id.", {"type": "integer"}),
                _query("kind", "One kind (run.state) or the kinds under one (run)."),
            ],
            _answer(
                "The events, and the id to ask the next page before (null: no more).",
                {
                    "type": "object",
                    "properties": {
                        "events": {"type": "array", "items": _ref("Event")},
                        "next_before": NULLABLE_INT,
                    },
                    "required": ["events", "next_before"],
                },
            ),
        ),
    }
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
            "schemas": SCHEMAS,
        },
        "paths": paths,
    }


async def get_openapi(request: Request) -> Response:
    return JSONResponse(document())


routes = [Route("/openapi.json", get_openapi, methods=["GET"])]
