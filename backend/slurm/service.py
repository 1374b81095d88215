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

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend import ids
from backend.clock import Clock
from backend.db import Database
from backend.errors import Conflict, FieldError, InvalidInput, NotFound
from backend.models import (
    Cluster,
    Run,
    SlurmAccount,
    SlurmRun,
    Worker,
)
from backend.organizations import service as organizations
from backend.slurm import jobs, nodes, parsing, repository, rules, submission
from backend.slurm.commands import SlurmCommands, SlurmSettings, SlurmUnavailable
from backend.slurm.parsing import Quarantined
from backend.slurm.rules import SlurmJob, SlurmNode

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
        await submission.submit_pending(db, clock, cluster_id, commands)
        async with db.read() as session:
            tracked = await repository.live_job_ids(session, cluster_id)
        snapshot = await read(commands, since, clock.now(), tracked)
        await submission.restart_stalled(db, cluster_id, commands, snapshot.jobs)
    except SlurmUnavailable as e:
        error = str(e)[:1000]
        log.warning("slurm: cluster %s not imported: %s", name, error)
        await db.unit(lambda s: _record_error(s, cluster_id, clock.now(), error))
        return ImportResult(cluster=name, error=error)
    return await db.unit(lambda s: apply(s, clock, cluster_id, snapshot))


async def read(
    commands: SlurmCommands, since: datetime, now: datetime, tracked: Sequence[str] = ()
) -> Snapshot:
    """The queue first, then accounting: a job that ended between the two is read as ended.
    ``tracked``: the jobs whose runs are live here, asked for by id when the queue no longer
    has them and accounting's window does not list them (a job cancelled while pending)."""
    queued = await commands.queue()
    accounted = rules.without_stubs(await commands.accounting(since, now + timedelta(minutes=1)))
    seen = {j.job_id for j in accounted} | {
        j.job_id for j in queued if j.state in rules.LIVE_STATES
    }
    missing = [job_id for job_id in tracked if job_id not in seen]
    not_jobs: list[str] = []
    if missing:
        answered = rules.without_stubs(await commands.jobs(missing))
        accounted += answered
        not_jobs = parsing.not_jobs(missing, [j.job_id for j in answered])
    found_nodes = await commands.nodes()
    merged = rules.merge(accounted, queued)
    return Snapshot(now, found_nodes, merged, list(commands.quarantined), not_jobs)


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
    machines = await nodes.sync_nodes(session, cluster, snapshot.nodes, clock.now())
    mapped = {a.account: w for a, w in await repository.accounts(session, cluster_id)}
    mine = [j for j in snapshot.jobs if j.account.lower() in mapped]

    result = ImportResult(cluster=cluster.name, jobs=len(mine))
    result.unmapped = dict(
        Counter(j.account for j in snapshot.jobs if j.account.lower() not in mapped)
    )
    known = await repository.imported_runs(session, cluster_id, [j.job_id for j in mine])
    workers = await repository.workers_of(session, [r.id for r in known.values()])
    kept = await repository.slurm_runs(session, [r.id for r in known.values()])
    codec = await ids.session_codec(session)  # (a submitted run's folder is named by it)
    for job in mine:
        ws = mapped[job.account.lower()]
        run = known.get(job.job_id)
        if run is None:
            run = await jobs.create(session, cluster, ws, job, machines, settings, codec)
            known[job.job_id] = run
            workers[run.id] = await _workers_of(session, run)
            result.created += 1
            continue
        slurm = kept.get(run.id)
        if slurm is None:  # (a run submitted here before its job was kept apart)
            slurm = SlurmRun(run_id=run.id, job_id=job.job_id, submitted=False, applied=None)
            repository.add(session, slurm)
        jobs.describe(slurm, job)
        if await jobs.advance(
            session,
            ws,
            run,
            slurm,
            workers[run.id],
            job,
            machines,
            snapshot.read_at,
            settings,
            codec,
        ):
            result.changed += 1
    jobs.set_pending_reasons(snapshot.jobs, known)
    await jobs.end_not_jobs(session, cluster_id, snapshot.not_jobs, snapshot.read_at)
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


async def _workers_of(session: AsyncSession, run: Run) -> list[Worker]:
    return (await repository.workers_of(session, [run.id]))[run.id]
