"""GraphQL types of runs, their workers and their history."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

import strawberry
from strawberry.scalars import JSON

from backend import ids, models
from backend.lifecycle.progress import is_straggler
from backend.request import slurm_jobs
from backend.request.context import Info
from backend.runs import failures
from backend.runs.rules import task_counts
from backend.schema.common import BigInt, UserError
from backend.schema.enums import (
    FailureKindValue,
    LifeStateValue,
    RunStateValue,
    WorkerStateValue,
)
from backend.schema.goodput import GoodputLedger, RunRework
from backend.schema.idle import IdlePolicy
from backend.spec import stored_spec


@strawberry.type(description="One state change, with the sentence that explains it.")
class HistoryEntry:
    transition_at: datetime
    state: LifeStateValue
    reason: str

    @classmethod
    def from_model(cls, row: models.StateTransition) -> HistoryEntry:
        state = LifeStateValue(row.state)
        return cls(transition_at=row.transition_at, state=state, reason=row.reason)


@strawberry.type(description="How a worker was started (seed L-28).")
class HowStarted:
    image: str | None
    command: list[str] | None
    user: str | None
    gpu_ids: list[int]
    restart_policy: str
    time_limit: str | None
    rank: int
    environment: JSON = strawberry.field(description="The specification's variables.")
    mounts: JSON = strawberry.field(description="Drives and where they are mounted.")


@strawberry.type(description="How many of a run's workers are in one state.")
class StateCount:
    state: WorkerStateValue
    count: int


@strawberry.type(description="Where a worker was placed last: its machine and GPU ids.")
class WorkerPlacement:
    machine: str
    gpu_ids: list[int]


@strawberry.type(description="One rank of a run, named <run>-<rank>.")
class Worker:
    _number: strawberry.Private[int]
    name: str
    rank: int
    state: WorkerStateValue
    reason: str
    state_since: datetime
    gpus: int = strawberry.field(description="GPUs it asks for.")
    gpu_ids: list[int] = strawberry.field(description="Indexes of the GPUs it holds now.")
    restarts: int
    restart_at: datetime | None
    exit_code: int | None
    last_failure: JSON | None = strawberry.field(
        description="The last failure snapshot: reason, failed_at, exit_code, log_tail."
    )
    _machine_id: strawberry.Private[int | None]
    _slow_since: strawberry.Private[datetime | None]
    _run_id: strawberry.Private[int]
    _cause: strawberry.Private[str | None] = None

    @classmethod
    def from_model(cls, row: models.Worker) -> Worker:
        return cls(
            _number=row.id,
            name=row.name,
            rank=row.rank,
            state=WorkerStateValue(row.state),
            reason=row.reason,
            state_since=row.state_since,
            gpus=row.gpus,
            gpu_ids=list(row.gpu_ids or []),
            restarts=row.restarts,
            restart_at=row.restart_at,
            exit_code=row.exit_code,
            last_failure=cast(JSON, row.last_failure),
            _machine_id=row.machine_id,
            _slow_since=row.slow_since,
            _run_id=row.run_id,
            _cause=row.cause,
        )

    @strawberry.field(description="Opaque, the same every time: it counts nothing (issue 37 N8).")
    async def id(self, info: Info) -> strawberry.ID:
        return strawberry.ID((await ids.codec(info.context.db)).show(ids.Kind.WORKER, self._number))

    @strawberry.field(description="Running well behind its gang's median pace for several minutes.")
    def straggler(self, info: Info) -> bool:
        return is_straggler(self, info.context.clock.now())

    @property
    def slow_since(self) -> datetime | None:
        return self._slow_since

    @strawberry.field(
        description="How it was started: image, command, user, GPU ids, restart policy, time "
        "limit, rank, environment and mounts."
    )
    async def started(self, info: Info) -> HowStarted:
        run = await info.context.loaders.run.load(self._run_id)
        assert run is not None, "a worker's run outlives it"
        spec = stored_spec(run.spec)
        return HowStarted(
            image=spec.image,
            command=spec.command,
            user=spec.user,
            gpu_ids=self.gpu_ids or await self._last_gpu_ids(info),
            restart_policy=spec.restart_policy,
            time_limit=spec.time_limit,
            rank=self.rank,
            environment=cast(JSON, dict(spec.environment)),
            mounts=cast(JSON, [m.model_dump(mode="json") for m in spec.mounts]),
        )

    @strawberry.field(
        description="Its failure turned into advice: its own end when it failed, else its last "
        "failure (a worker restarting in a loop); null when it never failed."
    )
    def advice(self) -> Advice | None:
        last_failure = cast(dict[str, Any] | None, self.last_failure)
        found = failures.worker_advised(
            self.state, self.reason, self.exit_code, self._cause, last_failure
        )
        return None if found is None else Advice.of(*found)

    @strawberry.field(description="Its own state changes with their reasons, newest first.")
    async def history(self, info: Info) -> list[HistoryEntry]:
        rows = await info.context.loaders.history_by_worker.load(self._number)
        return [HistoryEntry.from_model(r) for r in rows]

    @strawberry.field(description="The machine it is placed on, while placed.")
    async def machine(self, info: Info) -> str | None:
        if self._machine_id is None:
            return None
        return await info.context.loaders.machine_name.load(self._machine_id)

    @strawberry.field(
        description="Where it was placed last (its machine and GPU ids): where it is placed "
        "now, and kept after it ends or while it waits to be placed again; null before its "
        "first placement."
    )
    async def last_placement(self, info: Info) -> WorkerPlacement | None:
        if self._machine_id is not None:
            name = await info.context.loaders.machine_name.load(self._machine_id)
            return WorkerPlacement(machine=name, gpu_ids=self.gpu_ids)
        found = await info.context.loaders.last_placement.load(self._number)
        if found is None:
            return None
        name = await info.context.loaders.machine_name.load(found.machine_id)
        return WorkerPlacement(machine=name, gpu_ids=found.gpu_ids)

    async def _last_gpu_ids(self, info: Info) -> list[int]:
        found = await info.context.loaders.last_placement.load(self._number)
        return found.gpu_ids if found is not None else []


@strawberry.type(
    description="What a failure or a wait means and where to look: the seed's tables (Debug a "
    "failed run, step 2; Debug a run that does not start)."
)
class Advice:
    reason: str = strawberry.field(description="The failure's reason, as the worker said it.")
    exit_code: int | None
    kind: FailureKindValue = strawberry.field(
        description="A failure: program, command_not_found, out_of_memory, image_pull, "
        "time_limit, machine_lost, retry_budget, preempted, stalled, signal or other; a wait: "
        "machines, queue, plan, credential, drive, pulling, barrier or restart_loop."
    )
    look_at: str = strawberry.field(description="The seed's Look at sentence.")
    open: str = strawberry.field(
        description="What to open beside it: log, memory, metrics, machine, machines, queue, "
        "spec, credential, drive, workers or restarts."
    )

    @classmethod
    def of(cls, found: failures.Advice, reason: str, exit_code: int | None = None) -> Advice:
        return cls(
            reason=reason,
            exit_code=exit_code,
            kind=FailureKindValue(found.kind.value),
            look_at=found.look_at,
            open=found.open,
        )


@strawberry.type(
    description="The Slurm job that runs a run (issue 38): its id, partition, account, QOS, "
    "Slurm's own priority and who cancelled it, as Slurm says them."
)
class SlurmJob:
    job_id: str = strawberry.field(description="Slurm's job id (an array task's: <job>_<task>).")
    submitted_here: bool = strawberry.field(
        description="Astraeus submitted it (Run again resubmits it); false: imported from Slurm."
    )
    job_name: str
    account: str
    user: str = strawberry.field(description="The Slurm user it runs as.")
    partition: str
    qos: str = strawberry.field(description="Its quality of service.")
    priority: BigInt | None = strawberry.field(
        description="Slurm's own priority (not the run's: an unsigned 32-bit number, such as "
        "4294901759); null when Slurm did not say."
    )
    cancelled_by: str | None = strawberry.field(
        description="Who cancelled the job, as Slurm's accounting names them; null when nobody."
    )

    @classmethod
    def of(cls, job: slurm_jobs.SlurmJob) -> SlurmJob:
        return cls(
            job_id=job.job_id,
            submitted_here=job.submitted_here,
            job_name=job.job_name,
            account=job.account,
            user=job.user,
            partition=job.partition,
            qos=job.qos,
            priority=None if job.priority is None else BigInt(job.priority),
            cancelled_by=job.cancelled_by,
        )


@strawberry.type(
    description="The code a run ships with (issue 41, --workdir): a gzip'd tar of its "
    "workspace, named by its SHA-256, unpacked where each worker's command starts."
)
class RunCode:
    digest: str = strawberry.field(description="sha256: and 64 hexadecimal digits.")
    size: BigInt | None = strawberry.field(
        description="Its files' bytes, unpacked; null once it is no longer stored."
    )
    files: int | None
    archive_bytes: BigInt | None = strawberry.field(description="The archive's own bytes.")
    stored: bool = strawberry.field(
        description="False once it passed its retention: Run again needs it uploaded again."
    )


@strawberry.type(description="A job of one or more workers that start together.")
class Run:
    _number: strawberry.Private[int]
    name: str
    state: RunStateValue
    reason: str = strawberry.field(description="One sentence: why the run is in its state.")
    priority: int
    created_at: datetime
    state_since: datetime
    ended_at: datetime | None
    spec: JSON = strawberry.field(description="The specification, as Run again opens it.")
    _created_by_id: strawberry.Private[int | None]
    _cluster_id: strawberry.Private[int]
    _failures_in_row: strawberry.Private[int] = 0
    _running_since: strawberry.Private[datetime | None] = None
    _restart_at: strawberry.Private[datetime | None] = None
    _cause: strawberry.Private[str | None] = None
    _first_failure: strawberry.Private[dict[str, Any] | None] = None
    _waits_for: strawberry.Private[str | None] = None
    _stopping: strawberry.Private[bool] = False
    _gpus: strawberry.Private[int] = 0  # its gang's: workers times GPUs each
    _workspace_id: strawberry.Private[int] = 0
    _code_id: strawberry.Private[int | None] = None

    @classmethod
    def from_model(cls, row: models.Run) -> Run:
        return cls(
            _number=row.id,
            name=row.name,
            state=RunStateValue(row.state),
            reason=row.reason,
            priority=row.priority,
            created_at=row.created_at,
            state_since=row.state_since,
            ended_at=row.ended_at,
            spec=cast(JSON, row.spec),
            _created_by_id=row.created_by_id,
            _cluster_id=row.cluster_id,
            _failures_in_row=row.failures_in_row or 0,
            _running_since=row.running_since,
            _restart_at=row.restart_at,
            _cause=row.cause,
            _gpus=row.worker_count * row.gpus_per_worker,
            _first_failure=row.first_failure,
            _waits_for=row.waits_for,
            _stopping=row.stop_cause is not None,
            _workspace_id=row.workspace_id,
            _code_id=row.code_id,
        )

    @strawberry.field(description="Opaque, the same every time: it counts nothing (issue 37 N8).")
    async def id(self, info: Info) -> strawberry.ID:
        return strawberry.ID((await ids.codec(info.context.db)).show(ids.Kind.RUN, self._number))

    @strawberry.field(
        description='Its idle policy (spec "idle"), if it has one: stopped, or its workspace '
        "told, when every GPU stays under the utilization for the window (issue 41)."
    )
    def idle_policy(self) -> IdlePolicy | None:
        return IdlePolicy.stored(cast(dict[str, Any], self.spec).get("idle"))

    @strawberry.field(description='The code it ships with (spec "code"); null: none.')
    async def code(self, info: Info) -> RunCode | None:
        digest = cast(dict[str, Any], self.spec).get("code")
        if not digest:
            return None
        row = None
        if self._code_id is not None:
            row = await info.context.loaders.code_archive.load(self._code_id)
        if row is None:
            return RunCode(digest=digest, size=None, files=None, archive_bytes=None, stored=False)
        size, archive_bytes = BigInt(row.size), BigInt(row.archive_bytes)
        return RunCode(
            digest=digest, size=size, files=row.files, archive_bytes=archive_bytes, stored=True
        )

    @property
    def cause(self) -> str | None:
        return self._cause

    @property
    def first_failure(self) -> dict[str, Any] | None:
        return self._first_failure

    @strawberry.field(description="The cluster it runs on (a worker's page is under it).")
    async def cluster(self, info: Info) -> str:
        return await info.context.loaders.cluster_name.load(self._cluster_id)

    @strawberry.field(
        description="The Slurm job that runs it, on a Slurm cluster; null on any other cluster."
    )
    async def slurm(self, info: Info) -> SlurmJob | None:
        job = await info.context.loaders.slurm_job.load(self._number)
        return None if job is None else SlurmJob.of(job)

    @strawberry.field(description="Who submitted it.")
    async def created_by(self, info: Info) -> str | None:
        if self._created_by_id is None:
            return None
        return await info.context.loaders.user_name.load(self._created_by_id)

    @strawberry.field
    async def workers(self, info: Info) -> list[Worker]:
        rows = await info.context.loaders.workers_by_run.load(self._number)
        return [Worker.from_model(w) for w in rows]

    @strawberry.field(
        description="The worker that failed the run for good (the one its reason names; seed "
        "L-59), while the run is Failed."
    )
    async def failed_worker(self, info: Info) -> Worker | None:
        if self.state != "Failed":
            return None
        rows = await info.context.loaders.workers_by_run.load(self._number)
        failed = failures.failed_worker(self, rows)
        return None if failed is None else Worker.from_model(failed)

    @strawberry.field(
        description="Its failure turned into advice (seed: Debug a failed run, step 2): a "
        "Failed run's (its time limit, its retry budget, or the reason of the worker that "
        "failed it), a run restarting after a failure or a stall, a preempted run's until it "
        "runs again; null for the others."
    )
    async def advice(self, info: Info) -> Advice | None:
        failed = None
        if self.state == "Failed":
            rows = await info.context.loaders.workers_by_run.load(self._number)
            failed = failures.failed_worker(self, rows)
        max_restarts = stored_spec(cast(dict[str, Any], self.spec)).max_restarts
        found = failures.run_advised(self, failed, max_restarts)
        return None if found is None else Advice.of(*found)

    @strawberry.field(
        description="The Restarting in a loop panel (seed L-68, L-69): while it restarts after "
        "failures or stalls in a row; null when it does not."
    )
    async def restart_loop(self, info: Info) -> RestartLoop | None:
        if self.state in ("Completed", "Failed", "Stopped", "Deleted"):
            return None
        now = info.context.clock.now()
        restarts = failures.restarts_in_row(self._failures_in_row, self._running_since, now)
        if restarts == 0:
            return None
        rows = await info.context.loaders.workers_by_run.load(self._number)
        name = failures.last_snapshot(failures.snapshots_of(rows))
        return RestartLoop(
            restarts=restarts,
            max_restarts=stored_spec(cast(dict[str, Any], self.spec)).max_restarts,
            restart_at=self._restart_at,
            worker=next((Worker.from_model(w) for w in rows if w.name == name), None),
        )

    @strawberry.field(
        description="Why it does not start, and where to look (seed: Debug a run that does not "
        "start), from what it or its workers wait for; null when it is not waiting to start."
    )
    async def wait_advice(self, info: Info) -> Advice | None:
        if self.state not in ("Pending", "Preparing", "Pulling", "Starting"):
            return None
        rows = await info.context.loaders.workers_by_run.load(self._number)
        run = failures.Waiting(
            self.state.value,
            self.reason,
            self._waits_for,
            restart_at=self._restart_at,
            stopping=self._stopping,
        )
        workers = [failures.Waiting(w.state, w.reason, w.waits_for) for w in rows]
        found = failures.waiting(run, workers)
        return None if found is None else Advice.of(*found)

    @strawberry.field(description="Every state change of the run, oldest first.")
    async def history(self, info: Info) -> list[HistoryEntry]:
        rows = await info.context.loaders.history_by_run.load(self._number)
        return [HistoryEntry.from_model(r) for r in rows]

    @strawberry.field(
        description="Read a pending reason: why each machine of its cluster takes a worker or not."
    )
    async def pending_reasons(self, info: Info) -> list[MachineReason]:
        rows = await info.context.loaders.pending_reasons.load(self._number)
        return [MachineReason(machine=m, reason=r) for m, r in rows]

    @strawberry.field(description="Where its GPU time went since it was submitted.")
    async def goodput(self, info: Info) -> GoodputLedger:
        ledger = await info.context.loaders.run_ledger.load((self._number, self.created_at))
        return GoodputLedger.of(ledger)

    @strawberry.field(
        description="Effective training time ratio: its productive GPU time over its gang's "
        "GPUs times its wall time since it was submitted (to its end, or as far as the ledgers "
        "have counted while it goes); null before any time passed."
    )
    async def ettr(self, info: Info) -> float | None:
        key = (self._number, self.created_at, self.ended_at, self._gpus)
        return await info.context.loaders.run_ettr.load(key)

    @strawberry.field(
        description="The work it did again after restarts: a part of its productive time, from "
        "each restart until a worker reached its highest step again; gpuHours null (unknown, "
        "not 0) when it restarted without reporting checkpoints and steps."
    )
    async def rework(self, info: Info) -> RunRework:
        key = (self._number, self.created_at, self._workspace_id)
        return RunRework.of(await info.context.loaders.run_rework.load(key))

    @strawberry.field
    async def task_counts(self, info: Info) -> list[StateCount]:
        rows = await info.context.loaders.workers_by_run.load(self._number)
        counts = task_counts(w.state for w in rows)
        return [StateCount(state=WorkerStateValue(s), count=n) for s, n in counts.items()]


@strawberry.type(
    description="A run restarting in a loop: its restarts in a row, when the next attempt is, "
    "and the worker whose failure (or stall) is the last, with its output."
)
class RestartLoop:
    restarts: int = strawberry.field(description="Restarts in a row (the count the budget spends).")
    max_restarts: int = strawberry.field(description="After this many in a row it gives up.")
    restart_at: datetime | None = strawberry.field(
        description="When the next attempt is; null once it has started again."
    )
    worker: Worker | None = strawberry.field(
        description="The worker of the last failure snapshot: its lastFailure and advice."
    )


@strawberry.type
class CreateRunPayload:
    run: Run | None
    errors: list[UserError]


@strawberry.type
class RunPayload:
    run: Run | None
    errors: list[UserError]


@strawberry.type(description="Why one machine does or does not take a worker of a pending run.")
class MachineReason:
    machine: str
    reason: str
