"""Pure rules of metrics: the catalogue, what a sample must be to be kept, and how a range
request is read (labels, aggregation, times and the step). No database, no clock."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from backend.config import parse_duration
from backend.errors import FieldError, InvalidInput

Kind = Literal["gauge", "counter"]


@dataclass(frozen=True)
class Metric:
    """A metric the agents sample. The id is what a sample row stores: never reuse one."""

    id: int
    name: str
    kind: Kind
    # As the seed's metrics table writes it.
    unit: str
    per_gpu: bool


# The seed's unit of a ratio, written as its metrics table writes it.
RATIO = "0–1"  # noqa: RUF001

CATALOGUE = (
    Metric(1, "task_cpu_usage_cores", "gauge", "cores", per_gpu=False),
    Metric(2, "task_memory_used_bytes", "gauge", "bytes", per_gpu=False),
    Metric(3, "task_memory_limit_bytes", "gauge", "bytes", per_gpu=False),
    Metric(4, "task_oom_kills_total", "counter", "count", per_gpu=False),
    Metric(5, "task_network_receive_bytes_total", "counter", "bytes", per_gpu=False),
    Metric(6, "task_network_transmit_bytes_total", "counter", "bytes", per_gpu=False),
    Metric(7, "task_gpu_utilization_ratio", "gauge", RATIO, per_gpu=True),
    Metric(8, "task_gpu_memory_used_bytes", "gauge", "bytes", per_gpu=True),
    Metric(9, "task_gpu_sm_active_ratio", "gauge", RATIO, per_gpu=True),
    Metric(10, "task_gpu_tensor_active_ratio", "gauge", RATIO, per_gpu=True),
    Metric(11, "task_gpu_dram_active_ratio", "gauge", RATIO, per_gpu=True),
)
BY_NAME = {m.name: m for m in CATALOGUE}
BY_ID = {m.id: m for m in CATALOGUE}
COUNTER_IDS = tuple(m.id for m in CATALOGUE if m.kind == "counter")

# The gpu column of a worker's own metric: a key column cannot be NULL and still dedupe.
NO_GPU = -1
# GPU indexes a sample may carry: the largest NVIDIA machines (DGX-2, HGX-2) hold 16. A range
# query names them all (`gpu IN (0..15)`) so that each (worker, metric, gpu) series is one
# contiguous time range of the index rather than a scan of every GPU's whole history.
GPU_SLOTS = tuple(range(16))

MINUTE_MS = 60_000


# -- ingest --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleIn:
    """One sample as a machine's agent sends it."""

    worker_id: int
    metric: str
    gpu: int | None
    at_ms: int
    value: float
    # The attempt it was taken in; None: not said (taken as the one running).
    attempt: int | None = None


# (worker_id, ts, value, machine_id, metric, gpu): the sample tables' column order.
Row = tuple[int, int, float, int, int, int]
ROW_COLUMNS = ("worker_id", "ts", "value", "machine_id", "metric", "gpu")


@dataclass
class Dropped:
    """Samples not kept, by why. An agent that lags behind a placement change (a worker just
    released, a metric this server does not know yet) is expected, never an error."""

    unknown_worker: int = 0
    unknown_metric: int = 0
    bad_gpu: int = 0
    bad_value: int = 0

    @property
    def total(self) -> int:
        return self.unknown_worker + self.unknown_metric + self.bad_gpu + self.bad_value


def to_rows(
    samples: Iterable[SampleIn], workers: Mapping[int, int], machine_id: int
) -> tuple[list[Row], Dropped]:
    """The rows to store for a machine's samples, given the workers placed on it (their
    attempts by id): a sample of another machine's worker, or of another attempt, is dropped."""
    rows: list[Row] = []
    dropped = Dropped()
    for s in samples:
        attempt = workers.get(s.worker_id)
        metric = BY_NAME.get(s.metric)
        worker_id = s.worker_id
        if attempt is None or (s.attempt is not None and s.attempt != attempt):
            dropped.unknown_worker += 1
        elif metric is None:
            dropped.unknown_metric += 1
        elif not _gpu_fits(metric, s.gpu):
            dropped.bad_gpu += 1
        elif not math.isfinite(s.value):  # NaN cannot be stored the same on both databases
            dropped.bad_value += 1
        else:
            gpu = NO_GPU if s.gpu is None else s.gpu
            rows.append((worker_id, s.at_ms, s.value, machine_id, metric.id, gpu))
    return rows, dropped


def _gpu_fits(metric: Metric, gpu: int | None) -> bool:
    if metric.per_gpu:
        return gpu is not None and gpu in GPU_SLOTS
    return gpu is None


# -- range requests ------------------------------------------------------------------------------

LABELS = ("run", "worker", "machine", "gpu")
# The REST shim's words for a run and a worker (the seed's `match=task:<worker>`).
ALIASES = {"job": "run", "task": "worker"}
AGGREGATIONS = ("sum", "avg", "max", "min")
DEFAULT_RANGE_MS = 3_600_000
AUTO_POINTS = 300
MAX_POINTS = 11_000
# Steps people read at a glance; the automatic step is the first that gives <= 300 points.
NICE_STEPS_S = (
    *(1, 2, 5, 10, 15, 30),
    *(60, 120, 300, 600, 900, 1800),
    *(3600, 7200, 10800, 21600, 43200),
    *(86400, 172800, 604800, 1209600, 2592000),
)
# Numbers below this are Unix seconds (the seed's `$(date +%s)`), above it milliseconds.
SECONDS_BELOW = 10**11


@dataclass(frozen=True)
class RangeParams:
    """A range request as the caller spelled it."""

    metric: str | None
    match: Sequence[str] = ()
    by: str | None = None
    agg: str | None = None
    rate: str | None = None
    start: str | None = None
    end: str | None = None
    step: str | None = None


@dataclass(frozen=True)
class Grouping:
    """A label kept (``by``), under the name the caller used for it."""

    name: str
    label: str


@dataclass(frozen=True)
class RangeRequest:
    metric: Metric
    # Canonical label -> the values any of which a series must have.
    matches: Mapping[str, tuple[str, ...]]
    by: tuple[Grouping, ...]
    agg: str
    rate: bool
    start_ms: int
    end_ms: int
    step_ms: int

    @property
    def within_series(self) -> str:
        """How one series' samples in a step become one value, before series are combined.

        A sum across workers adds each worker's mean, never its sample count; a counter's
        value in a step is its last (for a count that only grows, its highest)."""
        if self.rate:
            return "rate"
        if self.metric.kind == "counter":
            return "max"
        return "avg" if self.agg in ("avg", "sum") else self.agg

    @property
    def unit(self) -> str:
        return f"{self.metric.unit}/s" if self.rate else self.metric.unit

    @property
    def gpus(self) -> tuple[int, ...]:
        """The gpu column values the query reads."""
        if not self.metric.per_gpu:
            return (NO_GPU,)
        wanted = self.matches.get("gpu")
        return tuple(sorted({int(g) for g in wanted})) if wanted else GPU_SLOTS


@dataclass(frozen=True)
class ScopedWorker:
    """A worker of the workspace a range query may read, and when its run ended."""

    id: int
    name: str
    run: str
    run_ended_ms: int | None
    machine: WorkerMachine | None = None  # where it is placed, or last ran; None: never placed
    read: bool = True  # its samples are read: ``in_scope``, as the statement found it


# A run's last samples may carry a time a little after its end (the agent's clock, its last
# sampling round).
ENDED_SLACK_MS = 5 * MINUTE_MS


def missing_names(
    request: RangeRequest, found: Iterable[ScopedWorker]
) -> tuple[str | None, str | None]:
    """The first run and the first worker named in ``match`` that the workspace does not have."""
    runs = {w.run for w in found}
    workers = {w.name for w in found}
    run = next((r for r in request.matches.get("run", ()) if r not in runs), None)
    worker = next((w for w in request.matches.get("worker", ()) if w not in workers), None)
    return run, worker


@dataclass
class _Errors:
    fields: list[FieldError] = field(default_factory=list)

    def add(self, name: str, reason: str) -> None:
        self.fields.append(FieldError(name, reason))


def parse_range(
    params: RangeParams, now_ms: int, *, raw_from_ms: int | None = None
) -> RangeRequest:
    """Check every parameter and say what is wrong with each at once (400, field by field).

    Raw samples are kept from ``raw_from_ms`` on; a range that starts before it reaches the
    one-minute summaries, and its automatic step is a minute at least."""
    errors = _Errors()
    metric = _metric(params.metric, errors)
    per_gpu = metric.per_gpu if metric else True
    metric_name = metric.name if metric else ""
    matches = _matches(params.match, per_gpu, metric_name, errors)
    by = _by(params.by, per_gpu, metric_name, errors)
    agg = _agg(params.agg, metric, errors)
    rate = _rate(params.rate, metric, errors)
    end_ms = _time("end", params.end, errors, default=now_ms)
    start_ms = _time("start", params.start, errors, default=(end_ms or now_ms) - DEFAULT_RANGE_MS)
    if start_ms is not None and end_ms is not None and start_ms >= end_ms:
        errors.add("start", "must be before end")
        start_ms = None
    step_ms = None
    if start_ms is not None and end_ms is not None:
        summarised = raw_from_ms is not None and start_ms < raw_from_ms
        min_step_ms = MINUTE_MS if summarised else 1000
        step_ms = _step(params.step, start_ms, end_ms, min_step_ms, errors)
    if errors.fields or metric is None or start_ms is None or end_ms is None or step_ms is None:
        raise InvalidInput("INVALID_PARAMETER", errors.fields)
    return RangeRequest(
        metric=metric,
        matches=matches,
        by=by,
        agg=agg,
        rate=rate,
        start_ms=start_ms - start_ms % step_ms,
        end_ms=end_ms,
        step_ms=step_ms,
    )


def _metric(raw: str | None, errors: _Errors) -> Metric | None:
    if not raw:
        errors.add("metric", "is required")
        return None
    metric = BY_NAME.get(raw)
    if metric is None:
        errors.add("metric", f"is not a metric Astraeus keeps: one of {', '.join(BY_NAME)}")
    return metric


def _label(raw: str) -> str | None:
    name = raw.strip().lower()
    label = ALIASES.get(name, name)
    return label if label in LABELS else None


_LABEL_HELP = "one of run, worker, machine, gpu (job and task name a run and a worker)"


def _matches(
    raw: Sequence[str], per_gpu: bool, metric: str, errors: _Errors
) -> dict[str, tuple[str, ...]]:
    found: dict[str, list[str]] = {}
    for item in raw:
        name, sep, value = item.partition(":")
        label = _label(name)
        if not sep or not value.strip():
            errors.add("match", f"'{item}' must be label:value, such as task:llama-sft-0")
        elif label is None:
            errors.add("match", f"'{name}' is not a label: {_LABEL_HELP}")
        elif label == "gpu" and not per_gpu:
            errors.add("match", f"{metric} is not per GPU: it has no gpu label")
        elif label == "gpu" and not (value.strip().isdigit() and int(value) in GPU_SLOTS):
            errors.add("match", f"gpu:{value} must name a GPU index from 0 to {GPU_SLOTS[-1]}")
        else:
            found.setdefault(label, []).append(value.strip())
    return {label: tuple(dict.fromkeys(values)) for label, values in found.items()}


def _by(raw: str | None, per_gpu: bool, metric: str, errors: _Errors) -> tuple[Grouping, ...]:
    kept: dict[str, Grouping] = {}
    for name in (raw or "").split(","):
        if not name.strip():
            continue
        label = _label(name)
        if label is None:
            errors.add("by", f"'{name.strip()}' is not a label: {_LABEL_HELP}")
        elif label == "gpu" and not per_gpu:
            errors.add("by", f"{metric} is not per GPU: it has no gpu label")
        else:
            kept.setdefault(label, Grouping(name.strip().lower(), label))
    return tuple(kept.values())


def _agg(raw: str | None, metric: Metric | None, errors: _Errors) -> str:
    if raw:
        if raw.lower() not in AGGREGATIONS:
            errors.add("agg", "must be sum, avg, max or min")
        return raw.lower()
    # Several workers' traffic or OOM kills add up; utilisation and memory read as a mean.
    return "sum" if metric is not None and metric.kind == "counter" else "avg"


def _rate(raw: str | None, metric: Metric | None, errors: _Errors) -> bool:
    text = (raw or "false").strip().lower()
    if text not in ("true", "false", "1", "0"):
        errors.add("rate", "must be true or false")
        return False
    rate = text in ("true", "1")
    if rate and metric is not None and metric.kind != "counter":
        errors.add("rate", f"{metric.name} is a gauge: a rate is of a counter (…_total)")
    return rate


# Times asked for lie from 1970 up to the year 3000: the goodput of 1000-01-01 to 9999-12-31
# overflowed a datetime (a 500), and no ledger or sample is older than Unix time.
LATEST_MS = 32_503_680_000_000  # 3000-01-01T00:00:00Z
TIME_RANGE = "must be a time from 1970 to 2999"
TIME_FORMS = "must be Unix seconds, Unix milliseconds or an RFC 3339 time"


class BadTime(ValueError):
    """A time parameter that is not one: its message is the field's error ("must be …")."""


def parse_time(raw: str) -> int:
    """Unix seconds (the seed's form), Unix milliseconds, or an RFC 3339 time, as epoch ms;
    BadTime says why it is none."""
    text = raw.strip()
    try:
        number: float | None = float(text)
    except ValueError:
        number = None
    if number is None:
        try:
            moment = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise BadTime(TIME_FORMS) from None
        if moment.tzinfo is None:
            raise BadTime("needs a time zone, such as 2026-10-01T00:00:00Z") from None
        ms = moment.timestamp() * 1000
    else:
        ms = number * 1000 if abs(number) < SECONDS_BELOW else number
    if not math.isfinite(ms) or not 0 <= ms < LATEST_MS:
        raise BadTime(TIME_RANGE)
    return round(ms)


def _time(name: str, raw: str | None, errors: _Errors, *, default: int) -> int | None:
    if raw is None or not raw.strip():
        return default
    try:
        return parse_time(raw)
    except BadTime as error:
        errors.add(name, str(error))
        return None


def points(start_ms: int, end_ms: int, step_ms: int) -> int:
    """How many steps cover [start, end] once start moves back to a step boundary."""
    aligned = start_ms - start_ms % step_ms
    return (end_ms - aligned) // step_ms + 1


def auto_step(start_ms: int, end_ms: int, min_step_ms: int = 1000) -> int:
    """The finest nice step that answers with at most 300 points."""
    for seconds in NICE_STEPS_S:
        step = seconds * 1000
        if step >= min_step_ms and points(start_ms, end_ms, step) <= AUTO_POINTS:
            return step
    days = math.ceil((end_ms - start_ms) / (AUTO_POINTS - 1) / 86_400_000)
    return days * 86_400_000


def _step(
    raw: str | None, start_ms: int, end_ms: int, min_step_ms: int, errors: _Errors
) -> int | None:
    if raw is None or not raw.strip():
        return auto_step(start_ms, end_ms, min_step_ms)
    try:
        step_ms = int(parse_duration(raw).total_seconds() * 1000)
    except ValueError as error:
        errors.add("step", str(error))
        return None
    if step_ms < 1000:
        errors.add("step", "must be at least 1s")
        return None
    count = points(start_ms, end_ms, step_ms)
    if count > MAX_POINTS:
        errors.add("step", f"gives {count} points over this range: at most {MAX_POINTS}")
        return None
    return step_ms


# -- metrics an agent cannot measure ---------------------------------------------------------

NETWORK_METRICS = ("task_network_receive_bytes_total", "task_network_transmit_bytes_total")


@dataclass(frozen=True)
class WorkerMachine:
    """A worker in a range query's scope and what its machine's agent said it cannot measure."""

    worker: str
    executor: str | None
    unmeasured: tuple[str, ...]


def not_measured_sentence(metric: str, executor: str | None) -> str:
    """Why a machine's agent does not measure ``metric`` for one worker, as the console says it."""
    if metric in NETWORK_METRICS:
        runs = "containers" if executor == "docker" else "processes"
        return f"Not measured: this machine's agent runs {runs} on the host's network"
    if metric in ("task_cpu_usage_cores", "task_memory_used_bytes", "task_oom_kills_total"):
        return "Not measured: this machine gives its agent no control groups"
    return "Not measured: this machine's agent cannot attribute it to one worker"


def not_measured(metric: str, placed: Sequence[WorkerMachine]) -> tuple[list[str], str | None]:
    """The workers (placed now or before) whose machine does not measure ``metric``, and the
    sentence that says so: the machine's reason, with how many of the workers when not all."""
    missing = [w for w in placed if metric in w.unmeasured]
    if not missing:
        return [], None
    sentence = not_measured_sentence(metric, missing[0].executor)
    if len(missing) < len(placed):
        sentence += f" ({len(missing)} of {len(placed)} workers)"
    return sorted(w.worker for w in missing), sentence
