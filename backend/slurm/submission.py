"""Runs submitted from Astraeus to a Slurm-backed cluster (issue 25): each pending run of a
mapped workspace is one `sbatch` (its workers the job's tasks); a run asked to stop is
cancelled in Slurm, one whose stall restarts it is queued again. The import (service.py)
calls these before it reads Slurm."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession

from backend import ids
from backend.clock import Clock
from backend.code import service as code
from backend.db import Database
from backend.ids import Kind
from backend.lifecycle.states import RunState
from backend.models import (
    Run,
    SlurmRun,
)
from backend.slurm import repository, results, rules
from backend.slurm.commands import SlurmCommands, SlurmSettings, SlurmUnavailable
from backend.slurm.rules import SlurmJob
from backend.spec import stored_spec

log = logging.getLogger(__name__)

CODE_FOLDER = "code"  # in the run's folder: its code, unpacked (issue 41)


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
    codec = await ids.codec(db)
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
        key = codec.show(Kind.RUN, run.id)
        folder = results.run_dir(settings.state_dir, key)
        results.prepare(folder)
        workdir = folder
        if stored_spec(run.spec).code:  # its code, where its tasks start (issue 41)
            workdir = folder / CODE_FOLDER
            problem = await _code_placed(db, run, workdir)
            if problem is not None:
                refused = f"Not submitted to Slurm: {problem}"
                await db.unit(functools.partial(_set_reason, run_id=run.id, reason=refused))
                continue
        script = rules.batch_script(_submission(run, key, account, settings, str(folder)))
        try:
            job_id = await commands.submit(script, str(workdir))
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


async def _code_placed(db: Database, run: Run, into: Path) -> str | None:
    """The run's code unpacked into its folder, which the cluster's nodes read (as they read
    its logs there); why not, or None. Every rank starts in it (sbatch --chdir)."""
    if run.code_id is None:
        return "its code is no longer stored: submit it again with --workdir"
    return await code.unpack_into(db, run.code_id, into)


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
    db: Database, cluster_id: int, commands: SlurmCommands, jobs: list[SlurmJob]
) -> None:
    """The jobs of runs the lifecycle found stalled, to restart (queued again, to begin when
    the restart's wait is over) or, their restarts spent, to cancel: each only while Slurm
    says it runs, just read (Slurm requeues a job that has ended, and it would run again)."""
    async with db.read() as session:
        stalled = await repository.stalled_jobs(session, cluster_id)
    running = {j.job_id for j in jobs if j.state == "RUNNING"}
    for job_id, start in stalled:
        if job_id not in running:
            continue  # ended meanwhile (its end is recorded now), or queued again already
        again = commands.requeue(job_id, start) if start else commands.cancel(job_id)
        await _ask(again, f"{'requeue' if start else 'cancel'} job {job_id}")


def _submission(
    run: Run, key: str, account: str, settings: SlurmSettings, folder: str
) -> rules.Submission:
    spec = stored_spec(run.spec)
    memory = spec.footprint.memory
    return rules.Submission(
        run_key=key,
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
