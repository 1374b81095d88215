"""The run specification: the JSON a user submits and "Run again" opens. Pure validation.

Every refused value is reported with its field's path and the reason, all at once.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from backend.config import format_duration, parse_duration
from backend.errors import FieldError, InvalidInput

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FILE_NAME = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9._-]{1,128}$")

# Set by Astraeus for every worker, so that torchrun-style code runs unmodified as a gang.
RESERVED_ENVIRONMENT = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "ASTRAEUS_RUN",
        "ASTRAEUS_WORKER",
    }
)

MAX_WORKERS = 4096
MAX_GPUS_PER_WORKER = 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)


class PerGpu(_Strict):
    memory_bytes: int | None = Field(default=None, gt=0)


def _absolute(value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise ValueError("must be an absolute path")
    return value


class Mount(_Strict):
    """A drive (a named folder on the machine, kept between runs) at a path of the worker."""

    drive: str = Field(pattern=NAME_PATTERN)
    path: str
    read_only: bool = False
    # A folder on the machine copied into the drive, when the drive is still empty, before
    # the worker starts ("Waiting for drive … to be filled" meanwhile).
    fill_from: str | None = None

    _paths = field_validator("path", "fill_from")(_absolute)


class Credential(_Strict):
    """A secret of the workspace given to the worker as a variable or as a file."""

    secret: str = Field(pattern=NAME_PATTERN)
    env: str | None = None
    file: str | None = None

    @field_validator("env")
    @classmethod
    def _variable(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.match(value):
            raise ValueError("is not a valid variable name")
        return value

    @field_validator("file")
    @classmethod
    def _file_name(cls, value: str | None) -> str | None:
        if value is not None and not FILE_NAME.match(value):
            raise ValueError("must be a file name: letters, digits, '.', '_' and '-', no '/'")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> Credential:
        if (self.env is None) == (self.file is None):
            raise ValueError("give env or file (one of them)")
        return self


def _canonical_duration(value: Any, *, positive: bool) -> str | None:
    if value is None:
        return None
    parsed = parse_duration(value)
    if positive and parsed <= timedelta(0):
        raise ValueError("must be longer than 0s")
    return format_duration(parsed)


class RunSpec(_Strict):
    """What one run asks for. Resources are per worker."""

    name: str = Field(pattern=NAME_PATTERN)
    cluster: str | None = None
    pool: str | None = None
    workers: int = Field(default=1, ge=1, le=MAX_WORKERS)
    gpus: int = Field(default=0, ge=0, le=MAX_GPUS_PER_WORKER)
    cpu: float = Field(default=1.0, gt=0, le=4096)
    memory_bytes: int | None = Field(default=None, gt=0)
    per_gpu: PerGpu | None = None
    image: str | None = Field(default=None, min_length=1, max_length=512)
    command: list[str] | None = None
    user: str | None = Field(default=None, min_length=1, max_length=64)
    environment: dict[str, str] = Field(default_factory=dict)
    mounts: list[Mount] = Field(default_factory=list)
    credentials: list[Credential] = Field(default_factory=list)
    priority: int = Field(default=50, ge=0, le=100)
    restart_policy: Literal["on_failure", "never"] = "on_failure"
    max_restarts: int = Field(default=10, ge=0, le=100)
    time_limit: str | None = None
    stall_timeout: str | None = None
    on_stall: Literal["restart", "keep"] = "restart"

    @field_validator("time_limit", "stall_timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> str | None:
        return _canonical_duration(value, positive=True)

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not value[0]):
            raise ValueError("must name a program: a non-empty list whose first item is not empty")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RunSpec:
        problems = []
        for key in self.environment:
            if not ENV_NAME.match(key):
                problems.append(f"environment.{key}: is not a valid variable name")
            elif key in RESERVED_ENVIRONMENT:
                problems.append(f"environment.{key}: is set by Astraeus for every worker")
        if self.image is None and self.command is None:
            problems.append("command: is required when no image is given")
        if self.memory_bytes is not None and self.per_gpu and self.per_gpu.memory_bytes:
            problems.append(
                "per_gpu.memory_bytes: give memory_bytes or per_gpu.memory_bytes, not both"
            )
        if self.per_gpu and self.per_gpu.memory_bytes and self.gpus == 0:
            problems.append("per_gpu.memory_bytes: the worker asks for no GPUs")
        for i, c in enumerate(self.credentials):
            if c.env in RESERVED_ENVIRONMENT:
                problems.append(f"credentials[{i}].env: is set by Astraeus for every worker")
            elif c.env is not None and c.env in self.environment:
                problems.append(f"credentials[{i}].env: is also given in environment")
        targets = [c.env or f"file:{c.file}" for c in self.credentials]
        if len(targets) != len(set(targets)):
            problems.append("credentials: two credentials go to the same variable or file")
        paths = [m.path for m in self.mounts]
        if len(paths) != len(set(paths)):
            problems.append("mounts: two mounts share a path")
        if problems:
            raise ValueError("|".join(problems))
        return self

    @property
    def time_limit_delta(self) -> timedelta | None:
        return parse_duration(self.time_limit) if self.time_limit else None

    @property
    def memory_limit_bytes(self) -> int | None:
        """The worker's memory limit: memory_bytes, or per_gpu.memory_bytes times its GPUs."""
        if self.memory_bytes is not None:
            return self.memory_bytes
        if self.per_gpu and self.per_gpu.memory_bytes:
            return self.per_gpu.memory_bytes * self.gpus
        return None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in {"[key]"}:
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "spec"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


_MESSAGES = {
    "missing": lambda ctx: "is required",
    "extra_forbidden": lambda ctx: "is not a field of a run specification",
    "greater_than_equal": lambda ctx: f"must be at least {_number(ctx['ge'])}",
    "greater_than": lambda ctx: f"must be more than {_number(ctx['gt'])}",
    "less_than_equal": lambda ctx: f"must be at most {_number(ctx['le'])}",
    "int_type": lambda ctx: "must be a whole number",
    "int_parsing": lambda ctx: "must be a whole number",
    "int_from_float": lambda ctx: "must be a whole number",
    "float_type": lambda ctx: "must be a number",
    "float_parsing": lambda ctx: "must be a number",
    "string_type": lambda ctx: "must be a string",
    "bool_type": lambda ctx: "must be true or false",
    "bool_parsing": lambda ctx: "must be true or false",
    "list_type": lambda ctx: "must be a list",
    "dict_type": lambda ctx: "must be an object",
    "model_type": lambda ctx: "must be an object",
    "literal_error": lambda ctx: f"must be one of {ctx['expected']}",
    "string_pattern_mismatch": lambda ctx: (
        "must be lowercase letters, digits and '-', starting and ending with a letter or "
        "digit, at most 63 characters"
    ),
    "string_too_short": lambda ctx: "must not be empty",
    "string_too_long": lambda ctx: f"must be at most {ctx['max_length']} characters",
}


def _field_errors(error: ErrorDetails) -> list[FieldError]:
    path = _path(tuple(error["loc"]))
    kind = error["type"]
    ctx = error.get("ctx", {})
    if kind == "value_error":
        message = str(ctx.get("error", error["msg"]))
        if path == "spec" and ": " in message:
            return [FieldError(*part.split(": ", 1)) for part in message.split("|")]
        return [FieldError(path, message)]
    describe = _MESSAGES.get(kind)
    return [FieldError(path, describe(ctx) if describe else error["msg"])]


def parse_spec(data: Any) -> RunSpec:
    """A validated specification, or InvalidInput naming every bad field."""
    if not isinstance(data, dict):
        raise InvalidInput("INVALID_SPEC", [FieldError("spec", "must be a JSON object")])
    try:
        return RunSpec.model_validate(data)
    except ValidationError as exc:
        fields: list[FieldError] = []
        for error in exc.errors(include_url=False):
            fields.extend(_field_errors(error))
        raise InvalidInput("INVALID_SPEC", fields) from None
