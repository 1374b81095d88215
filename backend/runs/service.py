"""The runs domain's entry point: submit a run, read runs, their workers and history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.clock import Clock
from backend.code import service as code
from backend.db.commit_jobs import after_commit
from backend.errors import Conflict, FieldError, InvalidInput, NotFound
from backend.job_names import PASS_JOB, SLURM_JOB
from backend.lifecycle import service as lifecycle
from backend.lifecycle.progress import is_straggler
from backend.lifecycle.records import record_transition
from backend.lifecycle.service import DeletionLedger
from backend.lifecycle.states import ENDED_RUN_STATES, RunState, WorkerState
from backend.models import Run, SlurmRun, StateTransition, Worker, Workspace
from backend.organizations import service as organizations
from backend.runs import failures, repository
from backend.runs.rules import WORKER_CREATED, plan_new_run
from backend.spec import RunSpec, parse_spec

STRAGGLER_REASON = "Running well behind its gang's median pace"


def _check_priority(ws: Workspace, spec: RunSpec) -> None:
    """A run's priority is at most its workspace's ceiling, which only organisation admins set:
    no member outranks other workspaces by a number of their own (admins included: they raise
    the ceiling first)."""
    if spec.priority > ws.priority_ceiling:
        raise InvalidInput(
            "INVALID_SPEC",
            [FieldError("priority", f"at most {ws.priority_ceiling} in workspace {ws.name}")],
        )


async def _check_credentials(session: AsyncSession, workspace_id: int, spec: RunSpec) -> None:
    """Each credential names a secret of the workspace (set, or declared external)."""
    if not spec.credentials:
        return
    known = await repository.secret_names(session, workspace_id)
    unknown = [
        FieldError(f"credentials[{i}].secret", f"no secret named '{c.secret}' in this workspace")
        for i, c in enumerate(spec.credentials)
        if c.secret not in known
    ]
    if unknown:
        raise InvalidInput("INVALID_SPEC", unknown)


async def create_run(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    raw_spec: Any,
    *,
    workspace: str | None = None,
) -> Run:
    """Validate a specification and record the run Pending with its workers.

    A refused specification writes nothing: every check comes before the first insert.
    """
    spec = parse_spec(raw_spec)
    ws = await organizations.workspace_for(session, principal, workspace)
    cluster, pool = await organizations.placement_target(
        session, ws.organization_id, spec.cluster, spec.pool
    )
    if cluster.slurm is not None:
        _check_slurm_spec(spec, cluster.name)
    if await repository.get_live_run_by_name(session, ws.id, spec.name) is not None:
        raise _name_taken(spec.name)
    _check_priority(ws, spec)
    await _check_credentials(session, ws.id, spec)
    archive = None
    if spec.code is not None:  # the workspace's own upload, or refused naming the field
        archive = await code.for_submission(session, clock, ws.id, spec.code)
    plan = plan_new_run(spec, clock.now())
    stored_spec = spec.to_json() | {"cluster": cluster.name, "pool": pool.name if pool else None}
    if spec.idle is None and pool is not None and pool.idle_policy and spec.gpus:
        # the pool's default, at submission (a run of a Slurm cluster's pool has none: refused
        # where it is set); kept in its specification, which Run again copies
        stored_spec["idle"] = dict(pool.idle_policy)
    run = Run(
        workspace_id=ws.id,
        cluster_id=cluster.id,
        name=plan.name,
        spec=stored_spec,
        priority=plan.priority,
        worker_count=plan.worker_count,
        gpus_per_worker=plan.gpus_per_worker,
        created_by_id=principal.user_id,
        state=plan.state.value,
        reason=plan.reason,
        state_since=plan.created_at,
        created_at=plan.created_at,
    )
    if "idle" in stored_spec:  # (set only then: a JSON column's None would be JSON null)
        run.idle_policy = stored_spec["idle"]
    if archive is not None:
        run.code_id = archive.id
    repository.add(session, run)
    try:
        await session.flush()
    except IntegrityError:
        raise _name_taken(spec.name) from None
    workers = [
        Worker(
            run_id=run.id,
            rank=w.rank,
            name=w.name,
            state=WorkerState.PENDING.value,
            reason=WORKER_CREATED,
            state_since=plan.created_at,
            gpus=w.gpus,
            gpu_ids=[],
            attempt=0,
            restarts=0,
            phase="waiting",
            ready=False,
            created_at=plan.created_at,
        )
        for w in plan.workers
    ]
    repository.add(session, *workers)
    await session.flush()
    record_transition(session, ws, run, None, run.state, run.reason, plan.created_at)
    for worker in workers:
        record_transition(
            session, ws, run, worker, worker.state, worker.reason, plan.created_at, phase="waiting"
        )
    await session.flush()
    # to be placed, or submitted to its cluster's Slurm
    after_commit(session, SLURM_JOB if cluster.slurm is not None else PASS_JOB)
    return run


async def run_again(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    name: str,
    new_name: str,
    *,
    workspace: str | None = None,
) -> Run:
    """A new run from a run's specification under a new name (the console's Run again). A run
    imported from Slurm has no specification of Astraeus's to run: refused, saying so."""
    run = await get_run(session, principal, name, workspace=workspace)
    if run.external_id is not None and not await submitted_here(session, run):
        raise Conflict(
            "RUN_IMPORTED",
            f"The run '{run.name}' is Slurm job {run.external_id}, imported: Astraeus has no "
            "script of it to run again; submit it to Slurm again (sbatch).",
        )
    spec = dict(run.spec or {})
    spec["name"] = new_name
    return await create_run(session, clock, principal, spec, workspace=workspace)


def _check_slurm_spec(spec: RunSpec, cluster: str) -> None:
    """What a run on a Slurm cluster cannot ask for (yet): its workers are Slurm's tasks,
    started by srun on the nodes as processes."""
    why = f"is not supported on cluster '{cluster}', which Slurm runs"
    refused = [
        FieldError(name, why)
        for name, given in (
            ("image", spec.image is not None),
            ("mounts", bool(spec.mounts)),
            ("credentials", bool(spec.credentials)),
            ("user", spec.user is not None),
            # Slurm's jobs are stopped by Slurm (scancel); the idle check looks at Astraeus's
            ("idle", spec.idle is not None),
        )
        if given
    ]
    if spec.command is None:
        refused.append(FieldError("command", f"is required on cluster '{cluster}' (Slurm runs it)"))
    if refused:
        raise InvalidInput("INVALID_SPEC", refused)


def _name_taken(name: str) -> Conflict:
    return Conflict(
        "RUN_EXISTS",
        f"A run named '{name}' already exists in this workspace.",
        [FieldError("name", "is taken by a run of this workspace that has not been deleted")],
    )


async def get_run(
    session: AsyncSession, principal: Principal, name: str, *, workspace: str | None = None
) -> Run:
    """A live run of the workspace; a run of another workspace is reported as absent."""
    ws = await organizations.workspace_for(session, principal, workspace)
    run = await repository.get_live_run_by_name(session, ws.id, name)
    if run is None:
        raise NotFound("JOB_NOT_FOUND", f"No run named '{name}' in workspace '{ws.name}'.")
    return run


async def get_worker(
    session: AsyncSession, principal: Principal, name: str, *, workspace: str | None = None
) -> tuple[Run, Worker]:
    """A worker of a live run of the workspace, by its name; another workspace's is absent."""
    ws = await organizations.workspace_for(session, principal, workspace)
    found = await repository.worker_by_name(session, ws.id, name)
    if found is None:
        raise NotFound("TASK_NOT_FOUND", f"No worker named '{name}' in workspace '{ws.name}'.")
    return found


async def worker_shown(session: AsyncSession, workspace_id: int, run_name: str) -> Worker | None:
    """The worker a run's name means where one worker is shown (its log: seed L-10): a Failed
    run's is the one its reason names, the first that failed (L-59), whose log has the cause;
    any other run's, its first. None when the workspace has no such live run."""
    run = await repository.get_live_run_by_name(session, workspace_id, run_name)
    if run is None:
        return None
    workers = (await repository.workers_by_run(session, [run.id])).get(run.id, [])
    if run.state == RunState.FAILED:
        found: Worker | None = failures.failed_worker(run, workers)
        if found is not None:
            return found
    return workers[0] if workers else None  # by rank


async def get_run_by_id(session: AsyncSession, principal: Principal, run_id: int) -> Run:
    run = await repository.get_run(session, run_id)
    if run is None:
        raise NotFound("JOB_NOT_FOUND", "No such run.")
    ws = await organizations.workspace(session, run.workspace_id)
    if ws is None or not principal.can_see_workspace(ws.id, ws.organization_id):
        raise NotFound("JOB_NOT_FOUND", "No such run.")
    return run


async def list_runs(
    session: AsyncSession,
    principal: Principal,
    *,
    include_ended: bool = False,
    workspace: str | None = None,
) -> list[Run]:
    ws = await organizations.workspace_for(session, principal, workspace)
    return await repository.list_runs(session, ws.id, include_ended=include_ended)


async def workers_by_run(session: AsyncSession, run_ids: Sequence[int]) -> dict[int, list[Worker]]:
    return await repository.workers_by_run(session, run_ids)


async def history_by_run(
    session: AsyncSession, run_ids: Sequence[int]
) -> dict[int, list[StateTransition]]:
    return await repository.run_history(session, run_ids)


async def history_by_worker(
    session: AsyncSession, worker_ids: Sequence[int]
) -> dict[int, list[StateTransition]]:
    return await repository.worker_history(session, worker_ids)


@dataclass(frozen=True)
class Attention:
    """A worker to look at now: stalled (no progress) or a straggler (well behind its gang)."""

    run: str
    worker: str
    machine_id: int | None
    kind: str  # stalled | straggler
    since: datetime
    reason: str


async def needing_attention(
    session: AsyncSession, principal: Principal, now: datetime, workspace: str | None = None
) -> list[Attention]:
    """The workspace's workers stalled now, then its stragglers (the goodput page lists them
    first)."""
    ws = await organizations.workspace_for(session, principal, workspace)
    stalled, slow = [], []
    for w, run in await repository.needing_attention(session, ws.id):
        if w.stalled_since is not None:
            stalled.append(
                Attention(run.name, w.name, w.machine_id, "stalled", w.stalled_since, w.reason)
            )
        elif is_straggler(w, now):
            assert w.slow_since is not None
            slow.append(
                Attention(
                    run.name, w.name, w.machine_id, "straggler", w.slow_since, STRAGGLER_REASON
                )
            )
    return stalled + slow


async def runs_by_id(session: AsyncSession, run_ids: Sequence[int]) -> dict[int, Run]:
    """Runs by id, for a caller that already may see them (their workers were read)."""
    return await repository.runs_by_id(session, run_ids)


async def user_names(session: AsyncSession, user_ids: Sequence[int]) -> dict[int, str]:
    return await repository.user_names(session, user_ids)


async def machine_names(session: AsyncSession, machine_ids: Sequence[int]) -> dict[int, str]:
    return await repository.machine_names(session, machine_ids)


async def cluster_names(session: AsyncSession, cluster_ids: Sequence[int]) -> dict[int, str]:
    return await repository.cluster_names(session, cluster_ids)


async def stop_run(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    name: str,
    *,
    workspace: str | None = None,
) -> Run:
    """Its owner (or anyone of its workspace) asks it to wind down. A run on a Slurm cluster
    is Slurm's job: one submitted from here is cancelled in Slurm (scancel, by the Slurm
    actor), and ends when Slurm ends it; one imported from Slurm is refused."""
    run = await get_run(session, principal, name, workspace=workspace)
    if run.external_id is None:
        await lifecycle.stop_run(session, clock, run, principal.user_name)
        after_commit(session, PASS_JOB)  # its GPUs are free once it has wound down
        return run
    if not await submitted_here(session, run):
        raise Conflict(
            "RUN_IMPORTED",
            f"The run '{run.name}' is Slurm job {run.external_id}, imported: it is not stopped "
            f"here; cancel it in Slurm (scancel {run.external_id}).",
        )
    if run.state in ENDED_RUN_STATES:
        raise Conflict("RUN_ENDED", f"The run '{run.name}' has already ended ({run.state}).")
    if run.stop_cause is None:
        ws = await organizations.workspace_for(session, principal, workspace)
        run.stop_cause, run.stop_by = "owner", principal.user_name
        run.reason = f"Stopping: asked by {principal.user_name}"
        record_transition(session, ws, run, None, run.state, run.reason, clock.now())
    after_commit(session, SLURM_JOB)  # cancelled in Slurm
    return run


async def submitted_here(session: AsyncSession, run: Run) -> bool:
    """A run submitted from Astraeus to a Slurm cluster (not one imported from it)."""
    slurm = await session.get(SlurmRun, run.id)
    return slurm is not None and slurm.submitted


async def delete_run(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    name: str,
    *,
    ledger: DeletionLedger,
    workspace: str | None = None,
) -> Run:
    """Delete the run: its workers and their logs go; the run stays listed as Deleted. Their
    GPU time up to now is counted first, by the ``ledger`` the caller hands in
    (backend.accounting.counting: runs never import the accounting that reads them).

    The rows it changes are locked first, each kind in id order and in the order every other
    writer takes them (the goodput mark, the run, its workers, the commands naming them): two
    deletions, or a deletion and a machine acknowledging its commands, cannot each hold a row
    the other waits for (issue 19: a deadlock on ``DELETE FROM workers``)."""
    run = await get_run(session, principal, name, workspace=workspace)
    if run.external_id is not None and run.state not in ENDED_RUN_STATES:
        raise Conflict(
            "RUN_NOT_ENDED",
            f"The run '{run.name}' is Slurm job {run.external_id}, not ended: stop it first "
            "(its history is Slurm's until it ends).",
        )
    await ledger.hold_mark(session)
    await repository.lock_for_deletion(session, run.id)
    await lifecycle.delete_run(session, clock, run, principal.user_name, ledger=ledger)
    after_commit(session, PASS_JOB)  # its GPUs are free
    return run
