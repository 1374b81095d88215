"""The REST shim's answers as pydantic models: every route serialises its body through one of
these, and the OpenAPI document's schemas are generated from the same classes, so the two
cannot drift. A field typed ``X | MISSING`` is absent from the body when not given (a
ledger's goodput when nothing was held, a log's ``archived``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import MISSING, BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

# A job's Slurm job is the one every surface reads (a dataclass: pydantic validates and documents
# it with its fields' docstrings, and forbids what it does not declare, as an Answer's own).
from backend.request.slurm_jobs import SlurmJob

Time = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
"""An RFC 3339 UTC time, as ``backend.clock.iso_z`` writes it."""


class Answer(BaseModel):
    """A body: frozen, no field it does not declare, attribute docstrings as descriptions."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    def response(
        self, status_code: int = 200, headers: dict[str, str] | None = None
    ) -> JSONResponse:
        return JSONResponse(self.model_dump(mode="json"), status_code=status_code, headers=headers)


# -- errors --------------------------------------------------------------------------------------


class FieldProblem(Answer):
    field: str
    reason: str


class Error(Answer):
    """An expected error: its code, a sentence, and each bad field and why."""

    code: str
    message: str
    errors: list[FieldProblem] | MISSING = MISSING


# -- jobs and tasks ------------------------------------------------------------------------------


class Advice(Answer):
    """A failure turned into the seed's advice (GraphQL's Advice, in snake case)."""

    reason: str
    exit_code: int | None
    kind: str
    look_at: str
    """The seed's Look at sentence."""
    open: str


class Transition(Answer):
    transition_at: Time
    state: str
    reason: str


class RestartLoop(Answer):
    """The Restarting in a loop panel: restarts in a row, when the next attempt is, the worker
    of the last failure and its snapshot."""

    restarts: int
    max_restarts: int
    restart_at: Time | None
    worker: str | None
    last_failure: dict[str, Any] | None


class RunCode(Answer):
    """A run's code: its digest, and its size while it is stored."""

    digest: str
    size: int | None
    """Its files' bytes, unpacked; null once it is no longer stored (past its retention)."""
    files: int | None
    stored: bool


class Code(Answer):
    """A run's code as uploaded (issue 41): a gzip'd tar named by its SHA-256, stored once per
    workspace."""

    digest: str
    """sha256: and the archive's 64 hexadecimal digits."""
    size: int
    """Its files' bytes, unpacked."""
    files: int
    archive_bytes: int
    """The archive's own bytes (gzip'd)."""
    uploaded_at: Time
    stored: bool
    """True when this upload stored it; false when the workspace had it already."""


class Job(Answer):
    """A run as the shim shows it (a job)."""

    name: str
    status: str
    reason: str
    priority: int
    created_at: Time
    created_by: str | None
    ended_at: Time | None
    history: list[Transition]
    task_counts: dict[str, int]
    task_names: list[str]
    spec: dict[str, Any]
    failed_worker: str | None
    """The worker that failed the run, while it is Failed."""
    advice: Advice | None
    """Its failure turned into the seed's advice (a Failed run, one restarting after a failure
    or a stall, a preempted one until it runs again)."""
    restart_loop: RestartLoop | None
    code: RunCode | None
    """The code it ships with (spec "code", issue 41); null: none."""
    slurm: SlurmJob | None
    """The Slurm job that runs it, on a Slurm cluster; null on any other cluster."""


class LastFailure(Answer):
    """A worker's last failure snapshot, as stored."""

    model_config = ConfigDict(extra="allow")

    reason: str | MISSING = MISSING
    failed_at: str | MISSING = MISSING
    exit_code: int | MISSING | None = MISSING
    log_tail: str | MISSING = MISSING


class Placement(Answer):
    machine: str | None
    gpu_ids: list[int]


class Task(Answer):
    """A worker as the shim shows it (a task)."""

    name: str
    job: str
    rank: int
    status: str
    reason: str
    status_since: Time
    gpus: int
    exit_code: int | None
    restarts: int
    restart_at: Time | None
    last_failure: LastFailure | None
    advice: Advice | None
    """Its failure (its own end, else its last) turned into advice."""
    placement: Placement | None
    metrics: dict[str, float | dict[str, float]]
    """Each metric's newest value of the last two minutes; per GPU (by index) where the seed
    measures GPUs."""


class Tasks(Answer):
    job: str
    tasks: list[Task]


class Logs(Answer):
    task_name: str
    logs: str
    archived: bool | MISSING = MISSING
    """Present (true) when the text came from the archive: the machine is gone."""


# -- metrics -------------------------------------------------------------------------------------


class Series(Answer):
    labels: dict[str, str]
    points: list[tuple[int, float]]
    """[time in ms, value]"""


class MetricRange(Answer):
    """One metric's series over time, times in ms."""

    metric: str
    kind: str
    unit: str
    start: int
    end: int
    step: int
    series: list[Series]
    unmeasured: list[str]
    """The workers whose machine's agent does not measure this metric (e.g. network bytes where
    workers share the host's network)."""
    not_measured: str | None
    """Why, as the console says it ("Not measured: this machine's agent runs processes on the
    host's network"); null when every worker's machine measures it."""


# -- goodput -------------------------------------------------------------------------------------


class Hours(Answer):
    """GPU-hours of each category (backend.accounting.rules.Category; a test holds the two
    equal)."""

    productive: float
    idle: float
    stalled: float
    starting: float
    restart: float
    failure: float
    preemption: float
    waiting: float


class Ledger(Answer):
    """GPU-hours by category; goodput is absent when nothing was held."""

    gpu_hours: Hours
    held_gpu_hours: Hours
    allocated_gpu_hours: float
    productive_gpu_hours: float
    lost_gpu_hours: float
    waiting_gpu_hours: float
    goodput: Annotated[float, Field(ge=0, le=1)] | MISSING = MISSING


class Named(Answer):
    name: str


class ReworkPart(Answer):
    """The rework inside a row's productive time: GPU-hours of steps done again after
    restarts, from each restart until a worker reached the run's highest step again."""

    rework_gpu_hours: float | None
    """The rework of the runs whose rework is known; a run's own row is null when its
    rework is unknown (it restarted without reporting its checkpoint or steps)."""
    rework_unknown_runs: int
    """How many runs restarted here without the reports that measure their rework."""


class NamedLedger(Ledger, ReworkPart, Named):
    """A row of a report: the workspace, run, machine or pool, its ledger and its rework."""


class ReportTotal(Ledger, ReworkPart):
    """A report's rows summed."""


class Report(Answer):
    by: str
    start: Time
    end: Time
    ledgers: list[NamedLedger]
    total: ReportTotal


class Cost(Answer):
    """Money by held category: a GPU-hour on a priced pool times its price."""

    cost: dict[str, float]
    """By category: productive, idle, stalled, starting, restart, failure, preemption."""
    held_cost: float
    lost_cost: float
    """All but productive."""


class NamedCost(Cost, Named):
    pass


class CostReport(Answer):
    by: str
    start: Time
    end: Time
    currency: str | None
    """ISO 4217; null when no pool of the organisation has a price."""
    ledgers: list[NamedCost]
    total: Cost


class Point(Ledger):
    """One step of a series: the ledger of [start, end)."""

    start: Time
    end: Time


class GoodputSeries(Answer):
    """Goodput over time: a ledger each hour or UTC day, none left out, and their sum (the
    report's row, or total, for the same period and scope)."""

    by: str
    name: str | None
    step: str
    start: Time
    end: Time
    points: list[Point]
    total: Ledger


class Week(Answer):
    week: str


class WeekReport(Report, Week):
    """A report over one ISO week (Monday, UTC)."""


class Weekly(Answer):
    by: str
    weeks: list[WeekReport]


class RunSince(Answer):
    run: str
    since: Time


class Redo(Answer):
    """A restart of the run and the work it did again."""

    attempt: int
    restarted_at: Time
    checkpoint_step: int | None
    """The last checkpoint the run had reported: where it went back to."""
    reached_step: int | None
    """The highest step the run had reported before the restart."""
    steps_redone: int | None
    until: Time | None
    """When a worker reached that step again (caught_up), or the run restarted once more;
    null while it still redoes them."""
    caught_up: bool
    gpu_hours: float | None
    """Productive GPU-hours spent redoing them; null when unknown."""


class RunRework(Answer):
    """A run's rework since it was submitted: a part of its productive time."""

    gpu_hours: float | None
    """Null ("unknown", not 0) when a restart came without checkpoint or step reports."""
    redos: list[Redo]


class RunLedger(Ledger, RunSince):
    """A run's own ledger since it was submitted, its ETTR and its rework."""

    rework: RunRework

    ettr: float | None
    """Effective training time ratio: its productive GPU time over its gang's GPUs times its
    wall time since it was submitted (to its end, or as far as the ledgers have counted while
    it goes); null before any time passed."""


class Interval(Answer):
    """A worker interval behind a ledger figure, cut to the period asked."""

    worker: str
    run: str | None
    machine: str | None
    start: Time
    end: Time
    category: str
    held: bool
    gpus: int
    gpu_hours: float


class Intervals(Answer):
    intervals: list[Interval]


# -- events --------------------------------------------------------------------------------------


class Event(Answer):
    id: str
    """Opaque (backend/ids.py): the same for the event every time, counting nothing."""
    kind: str
    state: str | None
    reason: str
    run: str | None
    worker: str | None
    workspace: str
    created_at: Time
    """When it happened (a stall: its start)."""
    found_at: Time
    """When it was found; events are listed in this order (by id)."""
    data: dict[str, Any]


class Events(Answer):
    events: list[Event]
    next_before: str | None
    """The id to ask the next page before; null: no more."""
