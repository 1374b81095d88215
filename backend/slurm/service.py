"""Slurm-backed clusters' entry point (issue 25): creating one, mapping its accounts to
workspaces, and importing what Slurm ran — every job, `sbatch` from a user's shell included —
as runs of the mapped workspaces, with their history to the second, so the goodput tick counts
them into the same ledgers as Astraeus's own runs: waiting while pending (not held), held from
start to end.

An import reads Slurm first (its commands take seconds, or block while slurmctld is down) and
then writes in one transaction, the cluster's import row locked: a second import at the same
time waits and then finds nothing new. Every change is forward only and dated by Slurm, so an
import retried or run twice records nothing twice.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from backend.clock import Clock, iso_offset
from backend.db import Database
from backend.errors import Conflict, FieldError, InvalidInput, NotFound
from backend.lifecycle.sentences import EndCause, worker_failed_sentence
from backend.lifecycle.states import Cause, Phase
from backend.models import (
    AgentCommand,
    Cluster,
    Gpu,
    Machine,
    Pool,
    Run,
    SlurmAccount,
    SlurmRun,
    Worker,
    Workspace,
)
from backend.organizations import service as organizations
from backend.runs import service as runs
from backend.runs.rules import ENDED_RUN_STATES, RunState
from backend.runs.spec import stored_spec
from backend.slurm import parsing, repository, results, rules
from backend.slurm.commands import SlurmCommands, SlurmSettings, SlurmUnavailable
from backend.slurm.parsing import Quarantined
from backend.slurm.rules import Change, SlurmJob, SlurmNode

log = logging.getLogger(__name__)

# Each import reads the jobs active since the last one began, less this: a job that slurmdbd
# recorded late (it keeps what slurmctld sends while it is away) is still read.
MARGIN = timedelta(minutes=10)
ACCOUNT_MAX = 64


@dataclass(frozen=True)
class Snapshot:
    """What Slurm said at ``read_at``: its nodes and every job of the window, one record each,
    and what it printed that could not be read (each record alone: the others are here)."""

    read_at: datetime
    nodes: list[SlurmNode]
    jobs: list[SlurmJob]
    quarantined: list[Quarantined] = field(default_factory=list)
    # The ids of live runs that name no job of Slurm's (parsing.not_jobs)
    not_jobs: list[str] = field(default_factory=list)


@dataclass
class ImportResult:
    cluster: str
    jobs: int = 0
    created: int = 0
    changed: int = 0
    unmapped: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    quarantined: dict[str, str] = field(default_factory=dict)  # record -> why


# ---- admin: clusters and accounts ----


async def create_cluster(
    session: AsyncSession,
    clock: Clock,
    organization_id: int,
    name: str,
    settings: SlurmSettings,
    *,
    since: datetime | None = None,
) -> Cluster:
    """A cluster run by Slurm; its jobs are imported from ``since`` (default: now)."""
    cluster = await organizations.create_cluster(
        session, clock, organization_id, name, slurm=settings.stored()
    )
    repository.add(session, repository.first_import(cluster.id, since or clock.now()))
    await session.flush()
    return cluster


async def map_account(
    session: AsyncSession,
    clock: Clock,
    organization_id: int,
    cluster_name: str,
    account: str,
    workspace_name: str | None,
) -> SlurmAccount | None:
    """The workspace a Slurm account's jobs are imported into (None: not imported any more;
    its runs imported so far stay)."""
    cluster = await slurm_cluster(session, organization_id, cluster_name)
    if not account or len(account) > ACCOUNT_MAX or any(c in account for c in " |,\n\t"):
        raise InvalidInput(
            "INVALID_ACCOUNT",
            [
                FieldError(
                    "account", f"must be a Slurm account name (1 to {ACCOUNT_MAX} characters)"
                )
            ],
        )
    found = await repository.account(session, cluster.id, account.lower())
    if workspace_name is None:
        if found is not None:
            await repository.delete(session, found)
        return None
    ws = await organizations.workspace_by_name(session, organization_id, workspace_name)
    if found is None:
        found = SlurmAccount(
            cluster_id=cluster.id,
            account=account.lower(),
            workspace_id=ws.id,
            created_at=clock.now(),
        )
        repository.add(session, found)
    found.workspace_id = ws.id
    await session.flush()
    return found


async def slurm_cluster(session: AsyncSession, organization_id: int, name: str) -> Cluster:
    cluster = await organizations.cluster_by_name(session, organization_id, name)
    if cluster.slurm is None:
        raise Conflict(
            "NOT_SLURM",
            f"Cluster '{name}' is scheduled by Astraeus, not Slurm.",
            [FieldError("cluster", "is not backed by Slurm (astraeus cluster create --slurm)")],
        )
    return cluster


@dataclass(frozen=True)
class Status:
    cluster: str
    settings: SlurmSettings
    accounts: list[tuple[str, str]]  # (account, workspace)
    since: datetime | None
    imported_at: datetime | None
    error: str | None
    error_at: datetime | None
    unmapped: dict[str, int]
    quarantined: dict[str, str]  # record -> why, of the last import


async def status(session: AsyncSession, organization_id: int, name: str) -> Status:
    cluster = await slurm_cluster(session, organization_id, name)
    row = await repository.import_row(session, cluster.id)
    return Status(
        cluster=cluster.name,
        settings=SlurmSettings.of(cluster.slurm),
        accounts=[(a.account, w.name) for a, w in await repository.accounts(session, cluster.id)],
        since=row.since if row else None,
        imported_at=row.imported_at if row else None,
        error=row.error if row else None,
        error_at=row.error_at if row else None,
        unmapped=dict(row.unmapped or {}) if row else {},
        quarantined=dict(row.quarantined or {}) if row else {},
    )


async def read_again_from(
    session: AsyncSession, organization_id: int, name: str, since: datetime
) -> None:
    """The next import reads every job active since ``since`` (after an account was mapped)."""
    cluster = await slurm_cluster(session, organization_id, name)
    row = await repository.lock_import(session, cluster.id)
    if row is None:
        repository.add(session, repository.first_import(cluster.id, since))
    else:
        row.since = since
    await session.flush()


# ---- the import ----


async def import_all(db: Database, clock: Clock) -> list[ImportResult]:
    """Every Slurm-backed cluster imported once (the import actor, each minute)."""
    async with db.read() as session:
        ids = await repository.slurm_cluster_ids(session)
    return [await import_cluster(db, clock, cluster_id) for cluster_id in ids]


async def import_cluster(db: Database, clock: Clock, cluster_id: int) -> ImportResult:
    """Read the cluster's Slurm, then write what changed; a Slurm that does not answer is
    recorded as the import's error (the status shows it) and tried again next time."""
    async with db.read() as session:
        cluster = await repository.cluster(session, cluster_id)
        row = await repository.import_row(session, cluster_id)
        if cluster is None or cluster.slurm is None:
            raise NotFound("CLUSTER_NOT_FOUND", "No such Slurm cluster.")
        name, settings = cluster.name, SlurmSettings.of(cluster.slurm)
        since = row.since if row is not None else clock.now()
    commands = SlurmCommands(settings)
    try:
        await submit_pending(db, clock, cluster_id, commands)
        async with db.read() as session:
            tracked = await repository.live_job_ids(session, cluster_id)
        snapshot = await read(commands, since, clock.now(), tracked)
        await restart_stalled(db, cluster_id, commands, snapshot)
    except SlurmUnavailable as e:
        error = str(e)[:1000]
        log.warning("slurm: cluster %s not imported: %s", name, error)
        await db.unit(lambda s: _record_error(s, cluster_id, clock.now(), error))
        return ImportResult(cluster=name, error=error)
    return await db.unit(lambda s: apply(s, clock, cluster_id, snapshot))


# ---- runs submitted here, as Slurm jobs ----


def no_account_reason(workspace: str, cluster: str) -> str:
    return (
        f"Waits for a Slurm account: workspace {workspace} has none on cluster {cluster} "
        f"(astraeus cluster account {cluster} ACCOUNT --workspace {workspace})"
    )


NO_STATE_DIR = (
    "Waits for the cluster's state folder: Astraeus submits to this Slurm cluster once it has "
    "one (astraeus cluster create --state-dir)"
)


async def submit_pending(
    db: Database, clock: Clock, cluster_id: int, commands: SlurmCommands
) -> int:
    """Each run submitted here to the cluster and not yet to Slurm, as one job (sbatch);
    how many were. sbatch runs outside any transaction; the job's id is written right after,
    and a run deleted meanwhile has its job cancelled."""
    async with db.read() as session:
        cluster = await repository.cluster(session, cluster_id)
        assert cluster is not None
        todo = await repository.unsubmitted(session, cluster_id)
        accounts = {w.id: a.account for a, w in await repository.accounts(session, cluster_id)}
    for job_id in await _cancel_asked(db, cluster_id):
        await _ask(commands.cancel(job_id), f"cancel job {job_id}")
    settings = commands.settings
    submitted = 0
    for run, ws in todo:
        account = accounts.get(ws.id)
        wait = (
            NO_STATE_DIR
            if settings.state_dir is None
            else no_account_reason(ws.name, cluster.name)
            if account is None
            else None
        )
        if wait is not None:
            if run.reason != wait:
                await db.unit(functools.partial(_set_reason, run_id=run.id, reason=wait))
            continue
        assert account is not None and settings.state_dir is not None
        folder = results.run_dir(settings.state_dir, run.id)
        results.prepare(folder)
        script = rules.batch_script(_submission(run, account, settings, str(folder)))
        try:
            job_id = await commands.submit(script, str(folder))
        except SlurmUnavailable as e:
            # Slurm refused this run (its account, partition, a limit) or did not answer: the
            # run says so and is submitted again next time; the others go on
            refused = f"Not submitted to Slurm: {e}"[:1000]
            await db.unit(functools.partial(_set_reason, run_id=run.id, reason=refused))
            continue
        kept = await db.unit(
            functools.partial(_submitted, run_id=run.id, job_id=job_id, account=account)
        )
        if kept:
            submitted += 1
        else:
            await commands.cancel(job_id)
    return submitted


async def _cancel_asked(db: Database, cluster_id: int) -> list[str]:
    """The jobs of runs asked here to stop that Slurm has not ended yet (scancel again is
    harmless: the job ends once)."""
    async with db.read() as session:
        return await repository.asked_to_stop(session, cluster_id)


async def _ask(action: Awaitable[None], what: str) -> None:
    """One job's cancel or requeue: one Slurm refuses (the job ended meanwhile, a job Slurm
    may not requeue) is asked again at the next import, and the import goes on: the job's end,
    read next, is what the run waits for."""
    try:
        await action
    except SlurmUnavailable as e:
        log.warning("slurm: could not %s: %s", what, e)


async def restart_stalled(
    db: Database, cluster_id: int, commands: SlurmCommands, snapshot: Snapshot
) -> None:
    """The jobs of runs the lifecycle found stalled, to restart (queued again, to begin when
    the restart's wait is over) or, their restarts spent, to cancel: each only while Slurm
    says it runs, just read (Slurm requeues a job that has ended, and it would run again)."""
    async with db.read() as session:
        stalled = await repository.stalled_jobs(session, cluster_id)
    running = {j.job_id for j in snapshot.jobs if j.state == "RUNNING"}
    for job_id, start in stalled:
        if job_id not in running:
            continue  # ended meanwhile (its end is recorded now), or queued again already
        again = commands.requeue(job_id, start) if start else commands.cancel(job_id)
        await _ask(again, f"{'requeue' if start else 'cancel'} job {job_id}")


def _submission(run: Run, account: str, settings: SlurmSettings, folder: str) -> rules.Submission:
    spec = stored_spec(run.spec)
    memory = spec.footprint.memory
    return rules.Submission(
        run_id=run.id,
        run=run.name,
        account=account,
        partition=spec.pool,
        workers=spec.workers,
        gpus=spec.gpus,
        cpus=max(1, math.ceil(spec.cpu_reserved)),
        memory_mb=-(-memory // 2**20) if memory else None,
        command=tuple(spec.command or ()),
        environment=tuple(sorted(spec.environment.items())),
        time_limit=spec.time_limit_delta,
        priority=spec.priority,
        run_dir=folder,
        python=settings.python,
        operator=settings.operator,
    )


async def _set_reason(session: AsyncSession, run_id: int, reason: str) -> None:
    run = await repository.lock_run(session, run_id)
    if run is not None and run.state == RunState.PENDING.value and run.external_id is None:
        run.reason = reason


async def _submitted(session: AsyncSession, run_id: int, job_id: str, account: str) -> bool:
    """The job's id on its run; False when the run was deleted or stopped meanwhile."""
    run = await repository.lock_run(session, run_id)
    if run is None or run.deleted_at is not None or run.state != RunState.PENDING.value:
        return False
    run.external_id = job_id
    run.reason = f"Submitted to Slurm as job {job_id}"
    # its job's first change (submitted, waiting) is the run's own creation here
    repository.add(
        session, SlurmRun(run_id=run.id, job_id=job_id, submitted=True, account=account, applied=1)
    )
    return True


async def read(
    commands: SlurmCommands, since: datetime, now: datetime, tracked: Sequence[str] = ()
) -> Snapshot:
    """The queue first, then accounting: a job that ended between the two is read as ended.
    ``tracked``: the jobs whose runs are live here, asked for by id when the queue no longer
    has them and accounting's window does not list them (a job cancelled while pending)."""
    queued = await commands.queue()
    accounted = await commands.accounting(since, now + timedelta(minutes=1))
    seen = {j.job_id for j in accounted} | {
        j.job_id for j in queued if j.state in rules.LIVE_STATES
    }
    missing = [job_id for job_id in tracked if job_id not in seen]
    not_jobs: list[str] = []
    if missing:
        answered = await commands.jobs(missing)
        accounted += answered
        not_jobs = parsing.not_jobs(missing, [j.job_id for j in answered])
    nodes = await commands.nodes()
    jobs = rules.merge(accounted, queued)
    return Snapshot(now, nodes, jobs, list(commands.quarantined), not_jobs)


async def _record_error(session: AsyncSession, cluster_id: int, now: datetime, error: str) -> None:
    row = await repository.lock_import(session, cluster_id)
    if row is None:
        row = repository.first_import(cluster_id, now)
        repository.add(session, row)
    row.error, row.error_at = error, now


async def apply(
    session: AsyncSession, clock: Clock, cluster_id: int, snapshot: Snapshot
) -> ImportResult:
    """Write what the snapshot says that is not written yet."""
    row = await repository.lock_import(session, cluster_id)
    cluster = await repository.cluster(session, cluster_id)
    assert cluster is not None
    if row is None:
        row = repository.first_import(cluster_id, snapshot.read_at)
        repository.add(session, row)
    settings = SlurmSettings.of(cluster.slurm)
    machines = await _sync_nodes(session, cluster, snapshot.nodes, clock.now())
    mapped = {a.account: w for a, w in await repository.accounts(session, cluster_id)}
    jobs = [j for j in snapshot.jobs if j.account.lower() in mapped]

    result = ImportResult(cluster=cluster.name, jobs=len(jobs))
    result.unmapped = dict(
        Counter(j.account for j in snapshot.jobs if j.account.lower() not in mapped)
    )
    known = await repository.imported_runs(session, cluster_id, [j.job_id for j in jobs])
    workers = await repository.workers_of(session, [r.id for r in known.values()])
    kept = await repository.slurm_runs(session, [r.id for r in known.values()])
    for job in jobs:
        ws = mapped[job.account.lower()]
        run = known.get(job.job_id)
        if run is None:
            run = await _create(session, cluster, ws, job, machines, settings)
            known[job.job_id] = run
            workers[run.id] = await _workers_of(session, run)
            result.created += 1
            continue
        slurm = kept.get(run.id)
        if slurm is None:  # (a run submitted here before its job was kept apart)
            slurm = SlurmRun(run_id=run.id, job_id=job.job_id, submitted=False, applied=None)
            repository.add(session, slurm)
        _describe(slurm, job)
        if await _advance(
            session, ws, run, slurm, workers[run.id], job, machines, snapshot.read_at, settings
        ):
            result.changed += 1
    _set_pending_reasons(snapshot.jobs, known)
    await _end_not_jobs(session, cluster_id, snapshot)
    row.since = max(row.since, snapshot.read_at - MARGIN)
    row.imported_at, row.error, row.error_at = snapshot.read_at, None, None
    row.unmapped = result.unmapped
    result.quarantined = {q.what: q.why for q in snapshot.quarantined}
    row.quarantined = result.quarantined
    await session.flush()
    if result.created or result.changed:
        log.info(
            "slurm: cluster %s: %d jobs imported, %d changed",
            cluster.name,
            result.created,
            result.changed,
        )
    return result


NOT_A_JOB = (
    "Not a Slurm job: an array's pending tasks, imported as a job of its own by an earlier "
    "version (each task is a run of its own)"
)


async def _end_not_jobs(session: AsyncSession, cluster_id: int, snapshot: Snapshot) -> None:
    """The live runs an earlier version made of an array's pending tasks (issue 38 F1) end,
    stopped, now (their history is forward only: what was counted stays), and may be deleted."""
    found = await repository.imported_runs(session, cluster_id, snapshot.not_jobs)
    live = [r for r in found.values() if r.state not in ENDED_RUN_STATES]
    workers = await repository.workers_of(session, [r.id for r in live])
    for run in live:
        ws = await organizations.workspace(session, run.workspace_id)
        assert ws is not None
        log.warning("slurm: run %s (%s) is no Slurm job: stopped", run.name, run.external_id)
        change = Change(
            at=max(snapshot.read_at, run.state_since),
            state=RunState.STOPPED.value,
            phase=Phase.ENDED.value,
            held=False,
            run_reason=NOT_A_JOB,
            worker_reason=NOT_A_JOB,
        )
        unwatched = _enter(session, ws, run, workers[run.id], change, {}, Tasks({}, {}))
        await repository.end_watches(session, unwatched, change.at)


async def _workers_of(session: AsyncSession, run: Run) -> list[Worker]:
    return (await repository.workers_of(session, [run.id]))[run.id]


# ---- nodes as machines ----


async def _sync_nodes(
    session: AsyncSession, cluster: Cluster, nodes: list[SlurmNode], now: datetime
) -> dict[str, Machine]:
    """Each node a machine of the cluster (in the pool of its first partition), with its GPUs
    and Slurm's state; a node Slurm no longer lists is removed."""
    machines = await repository.machines(session, cluster.id)
    pools = await repository.pools(session, cluster.id)
    for node in nodes:
        partition = node.partitions[0] if node.partitions else None
        pool = pools.get(partition) if partition else None
        if partition and pool is None:
            pool = Pool(cluster_id=cluster.id, name=partition, created_at=now)
            repository.add(session, pool)
            await session.flush()
            pools[partition] = pool
        machine = machines.get(node.name)
        if machine is None:
            machine = Machine(
                cluster_id=cluster.id, name=node.name, created_at=now, labels={}, executor="slurm"
            )
            repository.add(session, machine)
            machines[node.name] = machine
        state, reason = rules.machine_state(node)
        machine.pool_id = pool.id if pool else None
        machine.cpu_cores, machine.memory_bytes = node.cpus, node.memory_bytes
        machine.state, machine.reason, machine.last_seen_at = state, reason, now
        machine.labels = {"slurm_partitions": list(node.partitions)}
    listed = {n.name for n in nodes}
    for name, machine in machines.items():
        if name not in listed and machine.state != "removed":
            machine.state, machine.reason = "removed", "Slurm no longer lists this node"
    await session.flush()
    gpus = await repository.gpus_of(session, [m.id for m in machines.values()])
    for node in nodes:
        machine = machines[node.name]
        have = {g.index: g for g in gpus[machine.id]}
        for index in range(node.gpus):
            gpu = have.pop(index, None)
            if gpu is None:
                gpu = Gpu(machine_id=machine.id, index=index, uuid=f"slurm:{node.name}:{index}")
                repository.add(session, gpu)
            if gpu.uuid.startswith("slurm:"):  # else the node's agent named it (NVML's own)
                gpu.model = node.gpu_model
        await repository.delete(session, *have.values())
    return machines


# ---- jobs as runs ----


def _spec(
    cluster: Cluster, name: str, job: SlurmJob, gpus: list[int], settings: SlurmSettings
) -> dict[str, Any]:
    stalls = (
        {"stall_timeout": settings.stall_timeout, "on_stall": "keep"}
        if settings.stall_timeout
        else {}
    )
    return {
        "name": name,
        "cluster": cluster.name,
        "pool": job.partition or None,
        "workers": len(gpus),
        "gpus": max(gpus) if gpus else 0,
        "restart_policy": "never",
        "max_restarts": 0,
        **stalls,
    }


def _describe(slurm: SlurmRun, job: SlurmJob) -> None:
    """What Slurm says of the job now, as shown wherever its run is."""
    slurm.job_name, slurm.account, slurm.user = job.name[:256], job.account, job.user
    slurm.partition, slurm.qos, slurm.priority = job.partition, job.qos, job.priority or None
    slurm.cancelled_by = job.cancelled_by


async def _free_name(session: AsyncSession, workspace_id: int, wanted: str) -> str:
    """The run's name, or with a suffix where a live run of the workspace has it already."""
    taken = await repository.live_names(
        session, workspace_id, [wanted, *(f"{wanted[:58]}-{n}" for n in range(2, 10))]
    )
    if wanted not in taken:
        return wanted
    for n in range(2, 10):
        name = f"{wanted[:58]}-{n}"
        if name not in taken:
            return name
    raise Conflict("RUN_EXISTS", f"Runs named '{wanted}' and its variants already exist.")


async def _create(
    session: AsyncSession,
    cluster: Cluster,
    ws: Workspace,
    job: SlurmJob,
    machines: dict[str, Machine],
    settings: SlurmSettings,
) -> Run:
    name = await _free_name(session, ws.id, rules.run_name(job))
    gpus = rules.worker_gpus(job)
    run = Run(
        workspace_id=ws.id,
        cluster_id=cluster.id,
        name=name,
        spec=_spec(cluster, name, job, gpus, settings),
        priority=50,
        worker_count=len(gpus),
        gpus_per_worker=max(gpus) if gpus else 0,
        created_by_id=None,
        state=RunState.PENDING.value,
        reason="",
        state_since=job.submit,
        created_at=job.submit,
        external_id=job.job_id,
        attempt=0,
        failures_in_row=0,
    )
    repository.add(session, run)
    await session.flush()
    workers = [
        Worker(
            run_id=run.id,
            rank=rank,
            name=f"{name}-{rank}",
            state=RunState.PENDING.value,
            reason="",
            state_since=job.submit,
            gpus=count,
            gpu_ids=[],
            attempt=0,
            restarts=0,
            phase=Phase.WAITING.value,
            ready=False,
            created_at=job.submit,
        )
        for rank, count in enumerate(gpus)
    ]
    repository.add(session, *workers)
    await session.flush()
    every = rules.changes(job, [w.name for w in workers], _draining(machines))
    slurm = SlurmRun(run_id=run.id, job_id=job.job_id, submitted=False, applied=len(every))
    _describe(slurm, job)
    repository.add(session, slurm)
    tasks = _tasks(run, slurm, job, settings)
    unwatched: list[int] = []
    for change in every:
        unwatched += _enter(session, ws, run, workers, change, machines, tasks)
    await repository.end_watches(session, unwatched, job.end or job.submit)
    await session.flush()
    return run


async def _advance(
    session: AsyncSession,
    ws: Workspace,
    run: Run,
    slurm: SlurmRun,
    workers: list[Worker],
    job: SlurmJob,
    machines: dict[str, Machine],
    now: datetime,
    settings: SlurmSettings,
) -> bool:
    """Record the job's changes since the run was last written; whether there were any."""
    draining = _draining(machines)
    every = rules.changes(job, [w.name for w in workers], draining)
    done = _applied(run, slurm, len(every))
    todo = every[done:]
    if not todo and run.state == RunState.RUNNING.value and job.state == "PENDING":
        # queued again by Slurm, accounting not yet saying when the instance ended: from now
        # (the change accounting brings later is this one), off the nodes it was on
        on = {m.name for m in machines.values() if m.id in {w.machine_id for w in workers}}
        todo = [rules.requeue_change(now, "REQUEUED", tuple(sorted(on & draining)))]
    if not todo:
        return False
    unwatched: list[int] = []
    # a stop asked here is written at its own time, within the second its job then ends in
    asked_at = (
        await repository.last_change_at(session, run.id) if run.stop_cause == Cause.OWNER else None
    )
    for change in todo:
        # Slurm's times are whole seconds: a run submitted from here was created within the
        # second before its job's submit time, and its history never goes back.
        not_before = run.state_since
        if asked_at is not None and _asked_to_stop(run, change):
            not_before = max(not_before, asked_at)
        change = dataclasses.replace(change, at=max(change.at, not_before))
        slurm.applied = _applied(run, slurm, 0) + 1
        if asked_at is not None and change.at <= asked_at and change.phase != Phase.ENDED.value:
            # the job was in this state when the stop was asked (its row said the one known)
            await repository.restate_stop(session, run.id, asked_at, change.state)
        tasks = _tasks(run, slurm, job, settings)
        unwatched += _enter(session, ws, run, workers, change, machines, tasks)
    await repository.end_watches(session, unwatched, now)
    await session.flush()
    return True


def _draining(machines: dict[str, Machine]) -> frozenset[str]:
    """The nodes draining (or drained) as the import read them."""
    return frozenset(name for name, m in machines.items() if m.state == "draining")


@dataclass(frozen=True)
class Tasks:
    """Where each worker of a run's job runs, its GPUs there, and how each ended where it said
    so; and what the agents on the nodes are told to watch (``watch_payload``)."""

    nodes: dict[int, str]
    ends: dict[int, rules.TaskEnd]
    job_id: str = ""
    live: bool = False  # the job runs now (its workers are watched once placed)
    gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # A submitted run's: the cluster's state folder (its workers' logs and progress files)
    state_dir: str | None = None


def _tasks(run: Run, slurm: SlurmRun, job: SlurmJob, settings: SlurmSettings) -> Tasks:
    """An imported job's workers are its nodes; a submitted run's are its tasks, each on the
    node its agent.slurm_task said (else as srun lays tasks out: in blocks)."""
    count = run.worker_count
    live = job.state in rules.LIVE_STATES
    if not (slurm.submitted and settings.state_dir):
        nodes = {r: job.nodes[r] for r in range(min(count, len(job.nodes)))}
        gpus = {r: job.gpu_indexes[r] for r in nodes if r < len(job.gpu_indexes)}
        return Tasks(nodes, {}, job.job_id, live, gpus)
    folder = results.run_dir(settings.state_dir, run.id)
    started = results.starts(folder, count)
    nodes = {}
    for rank in range(count):
        node = started.get(rank) or (
            job.nodes[rank * len(job.nodes) // count] if job.nodes else None
        )
        if node is not None:
            nodes[rank] = node
    gpus = rules.task_gpus(job, nodes, run.gpus_per_worker)
    return Tasks(nodes, results.ends(folder, count), job.job_id, live, gpus, settings.state_dir)


def watch_payload(run: Run, rank: int, tasks: Tasks) -> dict[str, Any]:
    """What the agent on a worker's node watches of it (backend/agents/delivery.py turns it
    into the protocol's WatchWorker): a submitted run's worker is its task (its log and
    progress file in the run's folder, as agent.slurm_task keeps them); an imported job's is
    the job's part on the node, whose output is rank 0's log (its batch script runs there)."""
    payload: dict[str, Any] = {
        "run": run.name,
        "rank": rank,
        "attempt": run.attempt,
        "job_id": tasks.job_id,
        "gpu_ids": list(tasks.gpus.get(rank, ())),
    }
    if tasks.state_dir is None:
        return {**payload, "task": None, "batch_output": rank == 0}
    return {
        **payload,
        "task": rank,
        "state_dir": tasks.state_dir,
        "run_folder": results.run_dir(tasks.state_dir, run.id).name,
        "log": f"logs/{run.name}-{rank}",
        "progress": f"{rank}.progress",
    }


def _applied(run: Run, slurm: SlurmRun, count: int) -> int:
    """How many of its job's changes (rules.changes) the run has taken."""
    if slurm.applied is not None:
        return slurm.applied
    return 1 if run.state == RunState.PENDING.value else count  # (one made before it was kept)


def _enter(
    session: AsyncSession,
    ws: Workspace,
    run: Run,
    workers: list[Worker],
    change: Change,
    machines: dict[str, Machine],
    tasks: Tasks,
) -> list[int]:
    """The run and each worker enter the change's state at its time, in history. At a
    submitted run's end each worker ends as its task said, and a failed run names the worker
    that failed first (the earliest to exit with an error of its own). A worker placed on a
    node while its job runs is watched there by the node's agent (a WATCH); the workers whose
    watches end (the job ended, or was queued again) are returned."""
    change = _as_the_stall_asked(run, change)
    running = change.state == RunState.RUNNING.value
    ended = change.phase == Phase.ENDED.value
    requeued = change.phase in REQUEUED
    failed = ended and change.state == RunState.FAILED.value
    # (a job cancelled because its run stalled failed for that, not for its tasks' ends)
    stalled = run.stop_cause == Cause.STALL
    first = rules.first_failure(list(tasks.ends.values())) if failed and not stalled else None
    run_reason = change.run_reason
    asked = _asked_to_stop(run, change)
    if asked:
        run_reason = f"Stopped by {run.stop_by}"  # asked here, cancelled in Slurm
    if first is not None:
        run_reason = worker_failed_sentence(
            workers[first.rank].name, first.node, rules.task_end_sentence(first)
        )
    # placed: its first start, or placed again after a requeue (then running right after)
    placing = change.phase == Phase.RESTART or (running and run.state != RunState.STARTING.value)
    run.state, run.reason, run.state_since = change.state, run_reason, change.at
    run.waits_for = None
    if placing:
        run.attempt += 1
        run.placed_at = change.at
        run.restart_at = None
    if running:
        run.running_since = change.at
        run.started_at = run.started_at or change.at
    if ended:
        run.ended_at, run.running_since, run.cause = change.at, None, change.cause
    if requeued:
        run.running_since = run.placed_at = None
        run.stop_cause = None  # (a stall's restart: asked, and done)
    ending: dict[int, tuple[str, str]] = {}  # rank -> (state, reason) at the end
    for rank, w in enumerate(workers):
        state, reason = change.state, change.worker_reason
        if asked:
            state, reason = _stopped_end(tasks.ends.get(rank), run_reason)
        elif ended and tasks.ends:
            state, reason = _task_end(change, tasks.ends.get(rank), first, workers)
        ending[rank] = (state, reason)
        w.state, w.reason, w.state_since, w.phase = state, reason, change.at, change.phase
        if placing:
            node = tasks.nodes.get(rank)
            w.machine_id = machines[node].id if node in machines else None
            w.attempt = run.attempt
            w.gpu_ids = list(tasks.gpus.get(rank, ()))
            # a new instance: nothing of the last one's progress (nor stall) goes on
            w.stalled_since = w.progress_at = w.progress_step = None
            w.stepped_at = w.progress_rate = w.slow_since = None
            if w.machine_id is not None and tasks.live:
                _watch(session, run, rank, w, tasks, change.at)
        if requeued:
            w.restarts += 1
        if ended:
            end = tasks.ends.get(rank)
            w.exit_code = end.exit_code if end else change.exit_code
            w.cause = change.cause if state == RunState.FAILED.value else None
            if state == RunState.FAILED.value and (end is not None or rank == 0):
                w.last_failure = {
                    "reason": reason,
                    "failed_at": iso_offset(end.ended_at if end else change.at),
                    "exit_code": w.exit_code,
                    "log_tail": end.log_tail if end else "",
                }
    if failed and workers and not stalled:
        by = workers[first.rank] if first is not None else workers[0]
        run.first_failure = {
            "worker": by.name,
            "machine": first.node if first is not None else tasks.nodes.get(0),
            "reason": rules.task_end_sentence(first) if first is not None else change.worker_reason,
            "cause": change.cause,
            "at": iso_offset(first.ended_at if first is not None else change.at),
            "peer_lost": first is not None and rules.peer_lost(first),
        }
    runs.record_transition(session, ws, run, None, change.state, run_reason, change.at)
    for rank, w in enumerate(workers):
        state, reason = ending[rank]
        runs.record_transition(
            session, ws, run, w, state, reason, change.at, phase=change.phase, held=change.held
        )
    if not (ended or requeued):
        return []
    placed = [w.id for w in workers if w.machine_id is not None]
    for w in workers:
        w.machine_id = None
    return placed


REQUEUED = (
    Phase.REQUEUED_PREEMPTION,
    Phase.REQUEUED_FAILURE,
    Phase.REQUEUED_STALL,
    Phase.REQUEUED_ADMIN,
)


def _as_the_stall_asked(run: Run, change: Change) -> Change:
    """A job the lifecycle asked to restart (or end) because its run stalled: queued again
    by Slurm it waits as a stall's restart (*stalled*, not held), in the sentence the
    lifecycle wrote; cancelled, its run fails with it."""
    if run.stop_cause != Cause.STALL:
        return change
    if change.phase in REQUEUED:
        waiting = f"Waiting to be placed again: {run.reason}"
        return dataclasses.replace(
            change,
            phase=Phase.REQUEUED_STALL.value,
            run_reason=run.reason,
            worker_reason=waiting,
            cause=EndCause.STALLED.value,
        )
    if change.phase == Phase.ENDED.value and change.state == RunState.STOPPED.value:
        return dataclasses.replace(
            change, state=RunState.FAILED.value, run_reason=run.reason, cause=run.cause
        )
    return change


def _watch(
    session: AsyncSession, run: Run, rank: int, w: Worker, tasks: Tasks, at: datetime
) -> None:
    assert w.machine_id is not None
    repository.add(
        session,
        AgentCommand(
            machine_id=w.machine_id,
            worker_name=w.name,
            target_worker_id=w.id,
            worker_id=w.id,
            kind="watch",
            payload=watch_payload(run, rank, tasks),
            created_at=at,
        ),
    )


def _asked_to_stop(run: Run, change: Change) -> bool:
    """The job's end is the stop asked here (its owner's, cancelled in Slurm by the import)."""
    return (
        change.phase == Phase.ENDED.value
        and change.state == RunState.STOPPED.value
        and run.stop_cause == Cause.OWNER
    )


def _stopped_end(end: rules.TaskEnd | None, stopped: str) -> tuple[str, str]:
    """A submitted run's worker when the stop asked here ended its job: stopped as the run is
    (as the lifecycle stops an agent's worker: "Stopped by alice"), not failed of the signal
    scancel ended its task with; one whose task had completed before stays Completed."""
    if end is not None and end.exit_code == 0 and not end.signal:
        return RunState.COMPLETED.value, rules.task_end_sentence(end)
    return RunState.STOPPED.value, stopped


def _task_end(
    change: Change,
    end: rules.TaskEnd | None,
    first: rules.TaskEnd | None,
    workers: list[Worker],
) -> tuple[str, str]:
    """A submitted run's worker at its job's end: as its task ended, or stopped with its gang."""
    if end is not None and end.exit_code == 0:
        return RunState.COMPLETED.value, rules.task_end_sentence(end)
    if end is not None and (first is None or end.rank == first.rank or not end.signal):
        return RunState.FAILED.value, rules.task_end_sentence(end)
    if first is not None:
        return RunState.STOPPED.value, f"Stopping: worker {workers[first.rank].name} failed"
    return change.state, change.worker_reason


def _set_pending_reasons(jobs: list[SlurmJob], runs_by_job: dict[str, Run]) -> None:
    """Each pending job's reason, from Slurm's and its place in its partition's queue."""
    pending = [j for j in jobs if j.state == "PENDING"]
    ahead = rules.queue_ahead(pending)
    for job in pending:
        run = runs_by_job.get(job.job_id)
        if run is None or run.state != RunState.PENDING.value or run.stop_cause is not None:
            continue  # (a run asked to stop says so until Slurm has cancelled it)
        if run.attempt > 0:
            continue  # queued again: it says why ("Requeued by Slurm") until it runs again
        before = ahead.get(job.job_id)
        named = None
        if before is not None:
            before_run = runs_by_job.get(before.job_id)
            named = rules.Ahead(
                workspace_id=before_run.workspace_id if before_run else None,
                name=before_run.name if before_run else before.job_id,
            )
        run.reason, wait = rules.pending_reason(job, run.workspace_id, named)
        run.waits_for = wait.value if wait else None
