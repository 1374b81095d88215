"""The run specification: the JSON a user submits and "Run again" opens. Pure validation.

Every refused value is reported with its field's path and the reason, all at once.

Every part is bounded, and a refusal names the bound: a specification travels whole to each of
its workers' machines in one start command, which must fit in a gRPC message (4 MiB) with room
to spare, so one user's run cannot block a machine's command channel.
"""

from __future__ import annotations

import functools
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core.core_schema import ValidatorFunctionWrapHandler

from backend.config import format_duration, parse_duration
from backend.errors import FieldError, InvalidInput
from backend.spec_errors import CONTROL, Refusals, field_errors

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FILE_NAME = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9._-]{1,128}$")

# Set by Astraeus for every worker, so that torchrun-style code runs unmodified as a gang.
SET_BY_ASTRAEUS = frozenset(
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
# Read by the container runtime (NVIDIA Container Toolkit), CUDA or ROCm to choose which GPUs a
# process sees, in what order, and with which driver: a worker uses the GPUs it was given, so
# only Astraeus sets them.
DEVICE_SELECTION = frozenset(
    {
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_REQUIRE_CUDA",
        "CUDA_DEVICE_ORDER",
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
    }
)
RESERVED_ENVIRONMENT = SET_BY_ASTRAEUS | DEVICE_SELECTION
# Every name with this prefix is Astraeus's own (its settings, a worker's drives, progress file,
# secrets folder...), listed or not.
RESERVED_PREFIX = "ASTRAEUS_"

# Control characters (C0, DEL and C1: spec_errors.CONTROL) are refused in every string of a
# specification. Command arguments and variable values are free text that may span lines (a
# `python3 -c` script): they keep tab, newline and carriage return, and refuse NUL, the rest of
# C0 and DEL.
CONTROL_IN_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

MAX_WORKERS = 4096
MAX_GPUS_PER_WORKER = 1024

KIB = 1024
MIB = 1024 * KIB
# A start command carries the specification's image, command, environment and mounts (at most
# about 1 MiB together) and a worker's secret values come in a message of their own (at most
# 32 of 64 KiB: 2 MiB), both well within gRPC's 4 MiB.
MAX_SPEC_BYTES = 1 * MIB  # the whole specification, as JSON
MAX_VALUE_BYTES = 64 * KIB  # one variable's value
MAX_ENVIRONMENT_BYTES = 256 * KIB  # every variable's name and value together
MAX_VARIABLES = 1024
MAX_ARGUMENT_BYTES = 64 * KIB  # one command argument (Linux refuses one over 128 KiB)
MAX_COMMAND_BYTES = 256 * KIB  # the command's arguments together
MAX_ARGUMENTS = 4096
MAX_MOUNTS = 64
MAX_CREDENTIALS = 32
MAX_PATH_CHARACTERS = 4096  # PATH_MAX
MAX_NAME_CHARACTERS = 128  # a variable's, cluster's or pool's name


def format_size(size: int, *, bound: bool = False) -> str:
    """A measured size (``5.0 MiB``, ``12 bytes``) or a bound (``64 KiB``)."""
    for unit, scale in (("MiB", MIB), ("KiB", KIB)):
        if size >= scale:
            return f"{size // scale} {unit}" if bound else f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _over(what: str, limit: int, size: int) -> str:
    return f"{what} at most {format_size(limit, bound=True)} (this one is {format_size(size)})"


def _bounded(what: str, limit: int) -> AfterValidator:
    """Refuses a string over ``limit`` bytes of UTF-8: "a value is at most 64 KiB (…)"."""

    def check(value: str) -> str:
        size = len(value.encode())
        if size > limit:
            raise ValueError(_over(f"{what} is", limit, size))
        return value

    return AfterValidator(check)


def _refuse_long(what: str, limit: int, value: str) -> None:
    if len(value) > limit:
        raise ValueError(f"{what} is at most {limit} characters (this one has {len(value)})")


def _characters(what: str, limit: int) -> AfterValidator:
    """Refuses a string over ``limit`` characters: "a path is at most 4096 characters (…)"."""

    def check(value: str) -> str:
        _refuse_long(what, limit, value)
        return value

    return AfterValidator(check)


def reserved_reason(name: str) -> str | None:
    """Why a specification may not set the variable ``name``, or None when it may."""
    if name in SET_BY_ASTRAEUS:
        return "is set by Astraeus for every worker"
    if name in DEVICE_SELECTION:
        return "selects devices, which Astraeus does for every worker"
    if name.startswith(RESERVED_PREFIX):
        return f"starts with {RESERVED_PREFIX}, which is reserved for Astraeus"
    return None


def _refuse_control(value: object, control: re.Pattern[str]) -> None:
    if isinstance(value, str) and (found := control.search(value)):
        raise ValueError(f"must not contain control characters (found U+{ord(found[0]):04X})")


def _control_free(control: re.Pattern[str]) -> WrapValidator:
    """Refuses a control character before any other check of the string (its pattern)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        _refuse_control(value, control)
        result = handler(value)
        if not isinstance(value, str):  # bytes made into a string
            _refuse_control(result, control)
        return result

    return WrapValidator(check)


# A name, key, path or word: no control character at all.
Line = Annotated[str, _control_free(CONTROL)]
# A command argument or a variable's value: tab, newline and carriage return allowed.
Text = Annotated[str, _control_free(CONTROL_IN_TEXT)]


def _environment_name(value: Any, handler: ValidatorFunctionWrapHandler) -> str:
    name: str = handler(value)
    _refuse_long("a name", MAX_NAME_CHARACTERS, name)  # before its pattern
    if not ENV_NAME.match(name):
        raise ValueError("is not a valid variable name")
    if reason := reserved_reason(name):
        raise ValueError(reason)
    return name


EnvironmentName = Annotated[Line, WrapValidator(_environment_name)]
Value = Annotated[Text, _bounded("a value", MAX_VALUE_BYTES)]
Argument = Annotated[Text, _bounded("an argument", MAX_ARGUMENT_BYTES)]
MountPath = Annotated[Line, _characters("a path", MAX_PATH_CHARACTERS)]
Name = Annotated[Line, _characters("a name", MAX_NAME_CHARACTERS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)


class PerGpu(_Strict):
    memory_bytes: int | None = Field(default=None, gt=0)


def _absolute(value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise ValueError("must be an absolute path")
    return value


def _mount_path(value: str) -> str:
    """One rule for every machine: a relative path is under the worker's own folder (where
    every agent can put it: nothing of the machine's is touched); an absolute one is where the
    machine's owner allows mounts (a container: anywhere in it). Neither may climb out with
    '..' nor name the folder itself."""
    if not value:
        raise ValueError("must not be empty")
    if ".." in value.split("/"):
        raise ValueError("must not contain '..'")
    if posixpath.normpath(value) in ("/", "//"):
        raise ValueError("must not be the root folder")
    if posixpath.normpath(value) == ".":
        raise ValueError("must name a folder in the worker's own folder, not that folder")
    return value


def mount_key(path: str) -> str:
    """The place a mount path names: ``data``, ``./data`` and ``data/`` are one."""
    return posixpath.normpath(path)


class Mount(_Strict):
    """A drive (a named folder on the machine, kept between runs) at a path of the worker."""

    drive: Line = Field(pattern=NAME_PATTERN)
    path: MountPath
    read_only: bool = False
    # A folder on the machine copied into the drive, when the drive is still empty, before
    # the worker starts ("Waiting for drive … to be filled" meanwhile).
    fill_from: MountPath | None = None

    _path = field_validator("path")(_mount_path)
    _fill_from = field_validator("fill_from")(_absolute)


class Credential(_Strict):
    """A secret of the workspace given to the worker as a variable or as a file."""

    secret: Line = Field(pattern=NAME_PATTERN)
    env: Name | None = None
    file: Line | None = None

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
    _refuse_control(value, CONTROL)
    parsed = parse_duration(value)
    if positive and parsed <= timedelta(0):
        raise ValueError("must be longer than 0s")
    return format_duration(parsed)


# An idle policy's bounds: measured minute by minute, from one minute to a week.
IDLE_FOR_LEAST = timedelta(minutes=1)
IDLE_FOR_MOST = timedelta(days=7)


class IdlePolicy(_Strict):
    """``idle: {gpu_utilization_below: 5, for: "30m", action: "stop"}``: when every GPU of the
    run stays under the utilization (percent, each whole minute's mean) for the whole window,
    the run is stopped, or its owner told (``notify``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    gpu_utilization_below: float = Field(default=5.0, gt=0, le=100)
    for_: str = Field(alias="for")
    action: Literal["stop", "notify"] = "stop"

    @field_validator("for_", mode="before")
    @classmethod
    def _window(cls, value: Any) -> str | None:
        canonical = _canonical_duration(value, positive=True)
        window = parse_duration(canonical or "0s")
        if window % timedelta(minutes=1):
            raise ValueError("must be whole minutes: utilization is measured minute by minute")
        if not IDLE_FOR_LEAST <= window <= IDLE_FOR_MOST:
            raise ValueError("must be from 1m to 7d")
        return canonical

    @property
    def window(self) -> timedelta:
        return parse_duration(self.for_)


# What a worker whose specification names no ``cpu`` reserves on its machine: a tenth of a core,
# a Kubernetes LimitRange's usual default request (100m), so that many such workers share a
# small machine (issue 36: the default of 1 core fitted one 2-rank run on a 2-core laptop). It
# has no CPU limit: it may use any core nobody else uses, and where cores are contended it gets
# its share by what it reserved (its control group's weight), as a pod with a request and no
# limit does. A ``cpu`` given is reserved and enforced exactly.
DEFAULT_CPU = 0.1


class RunSpec(_Strict):
    """What one run asks for. Resources are per worker."""

    name: Line = Field(pattern=NAME_PATTERN)
    cluster: Name | None = None
    pool: Name | None = None
    workers: int = Field(default=1, ge=1, le=MAX_WORKERS)
    gpus: int = Field(default=0, ge=0, le=MAX_GPUS_PER_WORKER)
    # Cores per worker, reserved on its machine and its limit there; None: DEFAULT_CPU reserved
    # and no limit (it shares the machine's idle cores, weighted by what it reserved).
    cpu: float | None = Field(default=None, gt=0, le=4096)
    memory_bytes: int | None = Field(default=None, gt=0)
    per_gpu: PerGpu | None = None
    image: Line | None = Field(default=None, min_length=1, max_length=512)
    command: list[Argument] | None = Field(default=None, max_length=MAX_ARGUMENTS)
    user: Line | None = Field(default=None, min_length=1, max_length=64)
    # Names are checked one by one (syntax, then reserved); see reserved_reason.
    environment: dict[EnvironmentName, Value] = Field(
        default_factory=dict, max_length=MAX_VARIABLES
    )
    mounts: list[Mount] = Field(default_factory=list, max_length=MAX_MOUNTS)
    credentials: list[Credential] = Field(default_factory=list, max_length=MAX_CREDENTIALS)
    priority: int = Field(default=50, ge=0, le=100)
    restart_policy: Literal["on_failure", "never"] = "on_failure"
    max_restarts: int = Field(default=10, ge=0, le=100)
    time_limit: str | None = None
    stall_timeout: str | None = None
    on_stall: Literal["restart", "keep"] = "restart"
    idle: IdlePolicy | None = None
    # The code it ships with: an archive uploaded to its workspace (issue 41, --workdir),
    # unpacked into each worker's own folder before its command, which starts there.
    code: str | None = None

    @field_validator("time_limit", "stall_timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> str | None:
        return _canonical_duration(value, positive=True)

    @field_validator("code")
    @classmethod
    def _code(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
            raise ValueError(
                "must be sha256: and 64 hexadecimal digits: the SHA-256 of the run's code as "
                "uploaded (astra astraeus submit --workdir)"
            )
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not value[0]):
            raise ValueError("must name a program: a non-empty list whose first item is not empty")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RunSpec:
        problems: list[FieldError] = []
        if self.image is None and self.command is None:
            problems.append(FieldError("command", "is required when no image is given"))
        if self.memory_bytes is not None and self.per_gpu and self.per_gpu.memory_bytes:
            problems.append(
                FieldError(
                    "per_gpu.memory_bytes", "give memory_bytes or per_gpu.memory_bytes, not both"
                )
            )
        if self.per_gpu and self.per_gpu.memory_bytes and self.gpus == 0:
            problems.append(FieldError("per_gpu.memory_bytes", "the worker asks for no GPUs"))
        for i, c in enumerate(self.credentials):
            if c.env is None:
                continue
            if reason := reserved_reason(c.env):
                problems.append(FieldError(f"credentials[{i}].env", reason))
            elif c.env in self.environment:
                problems.append(FieldError(f"credentials[{i}].env", "is also given in environment"))
        targets = [c.env or f"file:{c.file}" for c in self.credentials]
        if len(targets) != len(set(targets)):
            problems.append(
                FieldError("credentials", "two credentials go to the same variable or file")
            )
        paths = [mount_key(m.path) for m in self.mounts]
        if len(paths) != len(set(paths)):
            problems.append(FieldError("mounts", "two mounts share a path"))
        if self.idle is not None and self.gpus == 0:
            problems.append(
                FieldError("idle", "the run asks for no GPUs: an idle policy measures its GPUs")
            )
        problems.extend(self._read_only_drives())
        problems.extend(self._totals())
        if problems:
            raise Refusals(problems)
        return self

    def _read_only_drives(self) -> list[FieldError]:
        """A drive is read-only in a worker or not: its folder is one, wherever it is mounted."""
        writable: dict[str, int] = {}
        for i, m in enumerate(self.mounts):
            if not m.read_only:
                writable.setdefault(m.drive, i)
        return [
            FieldError(
                f"mounts[{i}].read_only",
                f"drive {m.drive} is also mounted writable (mounts[{writable[m.drive]}]): a "
                "drive is read-only in a worker everywhere or nowhere",
            )
            for i, m in enumerate(self.mounts)
            if m.read_only and m.drive in writable
        ]

    def _totals(self) -> list[FieldError]:
        """Bounds of parts taken together, checked once each item is within its own."""
        environment = sum(len(k.encode()) + len(v.encode()) for k, v in self.environment.items())
        command = sum(len(a.encode()) for a in self.command or [])
        problems = [
            FieldError(field, _over(what, limit, size))
            for field, what, limit, size in (
                ("environment", "names and values are", MAX_ENVIRONMENT_BYTES, environment),
                ("command", "the arguments are", MAX_COMMAND_BYTES, command),
            )
            if size > limit
        ]
        if not problems:  # the whole, as the start command carries it
            size = len(json.dumps(self.to_json(), separators=(",", ":")).encode())
            if size > MAX_SPEC_BYTES:
                problems.append(
                    FieldError(
                        "spec", _over("a specification is", MAX_SPEC_BYTES, size) + " as JSON"
                    )
                )
        return problems

    @property
    def time_limit_delta(self) -> timedelta | None:
        return parse_duration(self.time_limit) if self.time_limit else None

    @property
    def stall_timeout_delta(self) -> timedelta | None:
        return parse_duration(self.stall_timeout) if self.stall_timeout else None

    @property
    def memory_limit_bytes(self) -> int | None:
        """The worker's memory limit: memory_bytes, or per_gpu.memory_bytes times its GPUs."""
        per_gpu = self.per_gpu.memory_bytes if self.per_gpu else None
        return memory_limit(self.memory_bytes, per_gpu, self.gpus)

    @property
    def cpu_reserved(self) -> float:
        """The cores each worker reserves: ``cpu``, or DEFAULT_CPU without it."""
        return DEFAULT_CPU if self.cpu is None else self.cpu

    @property
    def footprint(self) -> Footprint:
        return Footprint(
            self.cpu_reserved, self.memory_limit_bytes or 0, self.pool, self.image is not None
        )

    def to_json(self) -> dict[str, Any]:
        """As stored and as Run again opens it; ``idle`` and ``code`` only where the run has them
        (a specification written before they existed reads the same)."""
        absent = {name for name in ("idle", "code") if getattr(self, name) is None}
        return self.model_dump(mode="json", exclude=absent or None)


def memory_limit(memory_bytes: int | None, per_gpu_bytes: int | None, gpus: int) -> int | None:
    """A worker's memory limit: its memory_bytes, or per_gpu.memory_bytes times its GPUs."""
    if memory_bytes is not None:
        return memory_bytes
    if per_gpu_bytes:
        return per_gpu_bytes * gpus
    return None


@dataclass(frozen=True)
class Footprint:
    """What each worker of a run takes on its machine, and which machines may take it: the
    parts of its specification placement reads."""

    cpu: float
    memory: int  # bytes; 0 without a limit
    pool: str | None
    image: bool  # it names an image (only an agent that runs containers takes it)


def stored_footprint(
    cpu: float | None,
    memory_bytes: int | None,
    per_gpu_bytes: int | None,
    gpus: int,
    pool: str | None,
    image: str | None,
) -> Footprint:
    """A stored specification's footprint from its fields, as SQL reads them out of it (a
    field not stored is None): RunSpec's defaults and rules, without making a RunSpec (a
    scheduling pass reads thousands)."""
    if cpu is None:
        cpu = DEFAULT_CPU
    limit = memory_limit(memory_bytes, per_gpu_bytes, gpus)
    return Footprint(float(cpu), limit or 0, pool, image is not None)


def stored_spec(data: Mapping[str, Any]) -> RunSpec:
    """A run's stored specification read back: stored as ``RunSpec.to_json`` (with its cluster
    and pool as placed) once it was checked whole, so it is read as stored, not checked again: a
    specification an older version accepted (a bound since tightened) is read as it was. Every
    default is RunSpec's own (a key stored by an older version and no longer known is left
    out), never restated by a reader."""
    return _construct(RunSpec, data)


_M = TypeVar("_M", bound=_Strict)
# The parts of a specification that are models of their own.
_PARTS: dict[str, type[_Strict]] = {
    "per_gpu": PerGpu,
    "mounts": Mount,
    "credentials": Credential,
    "idle": IdlePolicy,
}


def _construct(model: type[_M], data: Mapping[str, Any]) -> _M:
    fields = _names(model)
    known = {fields[k]: v for k, v in data.items() if k in fields}
    for key, part in _PARTS.items():
        value = known.get(key)
        if isinstance(value, list):
            known[key] = [_construct(part, v) for v in value]
        elif isinstance(value, Mapping):
            known[key] = _construct(part, value)
    for key, (factory, default) in _defaults(model).items():
        if key not in known:
            known[key] = factory() if factory is not None else default
    return model.model_construct(**known)


@functools.cache
def _names(model: type[_Strict]) -> dict[str, str]:
    """Each field's key as stored (its alias where it has one: IdlePolicy's ``for``) and its
    name. Read once: pydantic's model_fields is a property, 0.8 us a look."""
    return {(field.alias or name): name for name, field in model.model_fields.items()}


@functools.cache
def _defaults(model: type[_Strict]) -> dict[str, tuple[Any, Any]]:
    """Each field's default, or its factory (called for each model made), read once: pydantic's
    model_construct looks into a factory's signature every time it fills a field with it
    (about 0.1 ms each, a scheduling pass's largest cost with 10 000 runs)."""
    return {
        name: (field.default_factory, field.default)
        for name, field in model.model_fields.items()
        if not field.is_required()
    }


def parse_idle_policy(data: Any) -> IdlePolicy:
    """A pool's default idle policy as an admin gives it (issue 41), checked as a run's
    ``idle`` is, or InvalidInput naming every bad field (``idle.for``)."""
    try:
        return IdlePolicy.model_validate(data)
    except ValidationError as exc:
        fields: list[FieldError] = []
        for error in exc.errors(include_url=False):
            error["loc"] = ("idle", *error["loc"])
            fields.extend(field_errors(error))
        raise InvalidInput("INVALID_IDLE_POLICY", fields) from None


def parse_spec(data: Any) -> RunSpec:
    """A validated specification, or InvalidInput naming every bad field."""
    if not isinstance(data, dict):
        raise InvalidInput("INVALID_SPEC", [FieldError("spec", "must be a JSON object")])
    try:
        return RunSpec.model_validate(data)
    except ValidationError as exc:
        fields: list[FieldError] = []
        for error in exc.errors(include_url=False):
            fields.extend(field_errors(error))
        raise InvalidInput("INVALID_SPEC", fields) from None
