"""Slurm's jobs as Astraeus's runs (issues 25, 38): a job first seen is a run of its mapped
workspace with a worker per task (or node), and every change Slurm recorded since the run was
last written enters its history, dated by Slurm, forward only (rules.changes: how many the run
has taken is kept on its slurm_runs row). At a submitted run's end each worker ends as its
task said; a worker placed on a node while its job runs is watched there by the node's agent."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from backend.errors import Conflict
from backend.ids import IdCodec, Kind
from backend.lifecycle import external
from backend.lifecycle.states import ENDED_RUN_STATES, Cause, Phase, RunState
from backend.models import (
    AgentCommand,
    Cluster,
    Machine,
    Run,
    SlurmRun,
    Worker,
    Workspace,
)
from backend.organizations import service as organizations
from backend.slurm import repository, results, rules
from backend.slurm.commands import SlurmSettings
from backend.slurm.rules import Change, SlurmJob

log = logging.getLogger(__name__)


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


def describe(slurm: SlurmRun, job: SlurmJob) -> None:
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


async def create(
    session: AsyncSession,
    cluster: Cluster,
    ws: Workspace,
    job: SlurmJob,
    machines: dict[str, Machine],
    settings: SlurmSettings,
    codec: IdCodec,
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
    describe(slurm, job)
    repository.add(session, slurm)
    tasks = _tasks(run, slurm, job, settings, codec)
    unwatched: list[int] = []
    for change in every:
        unwatched += _enter(session, ws, run, workers, change, machines, tasks)
    await repository.end_watches(session, unwatched, job.end or job.submit)
    await session.flush()
    return run


async def advance(
    session: AsyncSession,
    ws: Workspace,
    run: Run,
    slurm: SlurmRun,
    workers: list[Worker],
    job: SlurmJob,
    machines: dict[str, Machine],
    now: datetime,
    settings: SlurmSettings,
    codec: IdCodec,
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
    tasks = _tasks(run, slurm, job, settings, codec)  # the same for every change: read once
    # a stop asked here is written at its own time, within the second its job then ends in
    asked_at = (
        await repository.last_change_at(session, run.id) if run.stop_cause == Cause.OWNER else None
    )
    for change in todo:
        # Slurm's times are whole seconds: a run submitted from here was created within the
        # second before its job's submit time, and its history never goes back.
        not_before = run.state_since
        if asked_at is not None and external.asked_to_stop(run, change):
            not_before = max(not_before, asked_at)
        change = dataclasses.replace(change, at=max(change.at, not_before))
        slurm.applied = _applied(run, slurm, 0) + 1
        if asked_at is not None and change.at <= asked_at and change.phase != Phase.ENDED.value:
            # the job was in this state when the stop was asked (its row said the one known)
            await repository.restate_stop(session, run.id, asked_at, change.state)
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
    ends: dict[int, external.TaskEnd]
    job_id: str = ""
    live: bool = False  # the job runs now (its workers are watched once placed)
    gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # A submitted run's: the cluster's state folder (its workers' logs and progress files),
    # and the run's folder in it
    state_dir: str | None = None
    run_folder: str = ""


def _tasks(
    run: Run, slurm: SlurmRun, job: SlurmJob, settings: SlurmSettings, codec: IdCodec
) -> Tasks:
    """An imported job's workers are its nodes; a submitted run's are its tasks, each on the
    node its agent.slurm_task said (else as srun lays tasks out: in blocks)."""
    count = run.worker_count
    live = job.state in rules.LIVE_STATES
    if not (slurm.submitted and settings.state_dir):
        nodes = {r: job.nodes[r] for r in range(min(count, len(job.nodes)))}
        gpus = {r: job.gpu_indexes[r] for r in nodes if r < len(job.gpu_indexes)}
        return Tasks(nodes, {}, job.job_id, live, gpus)
    folder = results.found_run_dir(settings.state_dir, codec.show(Kind.RUN, run.id), run.id)
    started = results.starts(folder, count)
    nodes = {}
    for rank in range(count):
        node = started.get(rank) or (
            job.nodes[rank * len(job.nodes) // count] if job.nodes else None
        )
        if node is not None:
            nodes[rank] = node
    gpus = rules.task_gpus(job, nodes, run.gpus_per_worker)
    ends = results.ends(folder, count)
    return Tasks(nodes, ends, job.job_id, live, gpus, settings.state_dir, folder.name)


def watch_payload(run: Run, rank: int, tasks: Tasks) -> dict[str, Any]:
    """What the agent on a worker's node watches of it (backend/gateway/delivery.py turns it
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
        "run_folder": tasks.run_folder,
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
    """The change enters the run by the lifecycle (external.enter), its workers placed on the
    nodes' machines and, while the job runs, watched there by the nodes' agents (a WATCH)."""
    placement = external.Placement(
        nodes=tasks.nodes,
        machines={r: machines[n].id for r, n in tasks.nodes.items() if n in machines},
        gpus=tasks.gpus,
        ends=tasks.ends,
        live=tasks.live,
    )

    def watch(rank: int, w: Worker, at: datetime) -> None:
        _watch(session, run, rank, w, tasks, at)

    return external.enter(session, ws, run, workers, change, placement, watch)


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


def set_pending_reasons(jobs: list[SlurmJob], runs_by_job: dict[str, Run]) -> None:
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


NOT_A_JOB = (
    "Not a Slurm job: an array's pending tasks, imported as a job of its own by an earlier "
    "version (each task is a run of its own)"
)


async def end_not_jobs(
    session: AsyncSession, cluster_id: int, not_jobs: list[str], now: datetime
) -> None:
    """The live runs an earlier version made of an array's pending tasks (issue 38 F1) end,
    stopped, now (their history is forward only: what was counted stays), and may be deleted."""
    found = await repository.imported_runs(session, cluster_id, not_jobs)
    live = [r for r in found.values() if r.state not in ENDED_RUN_STATES]
    workers = await repository.workers_of(session, [r.id for r in live])
    for run in live:
        ws = await organizations.workspace(session, run.workspace_id)
        assert ws is not None
        log.warning("slurm: run %s (%s) is no Slurm job: stopped", run.name, run.external_id)
        change = Change(
            at=max(now, run.state_since),
            state=RunState.STOPPED.value,
            phase=Phase.ENDED.value,
            held=False,
            run_reason=NOT_A_JOB,
            worker_reason=NOT_A_JOB,
        )
        unwatched = _enter(session, ws, run, workers[run.id], change, {}, Tasks({}, {}))
        await repository.end_watches(session, unwatched, change.at)
