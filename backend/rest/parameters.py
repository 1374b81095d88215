"""The REST shim's path and query parameters as pydantic models: a route reads its query
through one (``GoodputQuery.of(request)``), and the OpenAPI document lists the parameters
from the same class.

Each value is read as the caller spelled it (a string, or strings when repeatable) and parsed
by the service that owns its rules, whose errors name the parameter; the type a client should
send is the field's documented schema (``Doc``)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, WithJsonSchema
from pydantic.json_schema import GenerateJsonSchema
from starlette.requests import Request

from backend.accounting.rules import CATEGORIES, MAX_WEEKS, SCOPES
from backend.metrics.rules import CATALOGUE


def Doc(schema: dict[str, Any]) -> WithJsonSchema:
    """The schema documented for a parameter read as text."""
    return WithJsonSchema(schema)


Text = Annotated[str | None, Doc({"type": "string"})]
Name = Annotated[str, Doc({"type": "string", "minLength": 1})]


class Parameters(BaseModel):
    """Parameters in one place (``location``: path or query), each field's docstring its
    description; ``required`` names the query parameters a call must give."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)
    location: ClassVar[str] = "query"
    required: ClassVar[frozenset[str]] = frozenset()
    repeated: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def of(cls, request: Request) -> Self:
        given = request.path_params if cls.location == "path" else request.query_params
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            if name in cls.repeated:
                values[name] = request.query_params.getlist(name)
            else:
                values[name] = given.get(name)
        return cls.model_validate(values)

    @classmethod
    def openapi(cls) -> list[dict[str, Any]]:
        """The OpenAPI parameter objects, from the model's JSON schema."""
        schema = cls.model_json_schema(schema_generator=_NoTitles)
        out = []
        for name, field in schema["properties"].items():
            field = dict(field)
            description = field.pop("description")
            field.pop("default", None)
            parameter: dict[str, Any] = {
                "name": name,
                "in": cls.location,
                "description": description,
                "schema": field,
            }
            if cls.location == "path" or name in cls.required:
                parameter["required"] = True
            if name in cls.repeated:
                parameter |= {"style": "form", "explode": True}
            out.append(parameter)
        return out


class _NoTitles(GenerateJsonSchema):
    """Without the titles pydantic derives from field names (noise in a parameter list)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


# -- path ----------------------------------------------------------------------------------------


class PathParameters(Parameters):
    location: ClassVar[str] = "path"


class RunPath(PathParameters):
    run: Name
    """The run's name."""


class WorkerPath(PathParameters):
    worker: Name
    """The worker's name, <run>-<rank>."""


class LogPath(PathParameters):
    worker: Name
    """The worker (a run's name: its first worker; a failed run's, the worker that failed it)."""


class ClusterPath(PathParameters):
    org: Name
    """The organisation."""
    cluster: Name
    """The cluster."""


class CodePath(PathParameters):
    digest: Annotated[str, Doc({"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"})]
    """The archive's SHA-256: sha256: and 64 hexadecimal digits."""


class WorkspacePath(PathParameters):
    org: Name
    """The organisation."""
    workspace: Name
    """The workspace."""


# -- query ---------------------------------------------------------------------------------------


class InWorkspace(Parameters):
    workspace: Text = None
    """A workspace of the caller's organisation (its admins); the token's by default."""


class InPeriod(Parameters):
    start: Text = None
    """RFC 3339 or Unix time; 7 days before end by default."""
    end: Text = None
    """RFC 3339 or Unix time; now by default. A period is at most 400 days."""


class Rows(Parameters):
    by: Annotated[str | None, Doc({"type": "string", "enum": list(SCOPES)})] = None
    """A row per workspace (default), run, machine or pool."""


class JobQuery(InWorkspace):
    pass


class TasksQuery(InWorkspace):
    required = frozenset({"job"})

    job: Annotated[str | None, Doc({"type": "string", "minLength": 1})] = None
    """The run."""


class LogsQuery(Parameters):
    tail: Annotated[str | None, Doc({"type": "integer", "minimum": 1, "maximum": 10_000})] = None
    """The last lines: 1 000 by default, at most 10 000."""


class RangeQuery(InWorkspace, InPeriod):
    required = frozenset({"metric"})
    repeated = frozenset({"match"})

    metric: Annotated[str | None, Doc({"type": "string", "enum": [m.name for m in CATALOGUE]})] = (
        None
    )
    """The metric."""
    match: Annotated[list[str], Doc({"type": "array", "items": {"type": "string"}})] = []
    """label:value, repeatable (run, worker, machine, gpu)."""
    by: Text = None
    """Labels to group by, comma-separated."""
    agg: Annotated[str | None, Doc({"type": "string", "enum": ["sum", "avg", "max", "min"]})] = None
    """How series are combined."""
    rate: Annotated[str | None, Doc({"type": "boolean"})] = None
    """Per-second rate of a counter."""
    step: Text = None
    """Seconds between points, or a duration (30s, 5m); automatic."""


class GoodputQuery(InWorkspace, InPeriod, Rows):
    pass


class ClusterGoodputQuery(InPeriod, Rows):
    pass


class WeeklyQuery(InWorkspace, Rows):
    weeks: Annotated[str | None, Doc({"type": "integer", "minimum": 1, "maximum": MAX_WEEKS})] = (
        None
    )
    """How many: 8 by default."""


class IntervalsQuery(InWorkspace, InPeriod, Rows):
    required = frozenset({"name"})

    name: Text = None
    """The run, machine, pool or workspace."""
    category: Annotated[
        str | None, Doc({"type": "string", "enum": [c.value for c in CATEGORIES]})
    ] = None
    """One category."""
    limit: Annotated[str | None, Doc({"type": "integer", "minimum": 1, "maximum": 10_000})] = None
    """At most this many: 1 000 by default."""


class SeriesQuery(InWorkspace, InPeriod, Rows):
    name: Text = None
    """One run, machine, pool or workspace; every one the caller reads, summed, by default."""
    step: Annotated[str | None, Doc({"type": "string", "enum": ["hour", "day"]})] = None
    """A point an hour (default) or a UTC day."""


class EventsQuery(Parameters):
    name: Text = None
    """Of one run."""
    limit: Annotated[str | None, Doc({"type": "integer", "minimum": 1, "maximum": 500})] = None
    """At most this many: 50 by default."""
    before: Text = None
    """The next page: events before this id (an event's id or a page's next_before)."""
    kind: Text = None
    """One kind (run.state) or the kinds under one (run)."""
