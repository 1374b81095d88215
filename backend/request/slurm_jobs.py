"""The Slurm job of each run, as every surface shows it (GraphQL's Run.slurm, REST's job
``slurm``, the CLI's Slurm line, the console's readout; issue 38): what Slurm says of the job,
never the import's own bookkeeping (how far it has written the job's life).

The one query here stands in for a read of the slurm domain's service, which is being rewritten
under issue 38 (its repository is its own): move it there when that settles."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import SlurmRun

BATCH = 1000  # run ids in one IN list: well under any driver's parameter limit


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job that runs a run (GraphQL's SlurmJob, in snake case; issue 38)."""

    # REST's job ``slurm`` is this class (backend/rest/answers.py Job): its fields and these
    # docstrings are that answer's schema in the OpenAPI document.
    job_id: str
    """Slurm's job id (an array task's: <job>_<task>)."""
    submitted_here: bool
    """Astraeus submitted it (Run again resubmits it); false: imported from Slurm."""
    job_name: str
    account: str
    user: str
    """The Slurm user it runs as."""
    partition: str
    qos: str
    priority: int | None
    """Slurm's own priority (not the run's); null when Slurm did not say."""
    cancelled_by: str | None
    """Who cancelled the job, as Slurm's accounting names them; null when nobody."""

    @classmethod
    def of(cls, row: SlurmRun) -> SlurmJob:
        return cls(
            job_id=row.job_id,
            submitted_here=row.submitted,
            job_name=row.job_name,
            account=row.account,
            user=row.user,
            partition=row.partition,
            qos=row.qos,
            priority=row.priority,
            cancelled_by=row.cancelled_by,
        )


async def slurm_jobs(session: AsyncSession, run_ids: Sequence[int]) -> dict[int, SlurmJob]:
    """The Slurm jobs of these runs, by run id; a run on a cluster that is not Slurm's has
    none. The caller already may see the runs."""
    found: dict[int, SlurmJob] = {}
    ids = list(run_ids)
    for start in range(0, len(ids), BATCH):
        rows = await session.scalars(
            select(SlurmRun).where(SlurmRun.run_id.in_(ids[start : start + BATCH]))
        )
        found.update({row.run_id: SlurmJob.of(row) for row in rows})
    return found
