"""The Slurm job of each run, as every surface shows it (GraphQL's Run.slurm, REST's job
``slurm``, the CLI's Slurm line, the console's readout; issue 38): what Slurm says of the job,
never the import's own bookkeeping (how far it has written the job's life).

The one query here stands in for a read of the slurm domain's service, which is being rewritten
under issue 38 (its repository is its own): move it there when that settles."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import SlurmRun

BATCH = 1000  # run ids in one IN list: well under any driver's parameter limit


@dataclass(frozen=True)
class SlurmJob:
    """A run's Slurm job: its id, whether Astraeus submitted it (else it was imported from
    Slurm), its name, account, user, partition, QOS, Slurm's own priority (None: not known)
    and who cancelled it (None: nobody)."""

    job_id: str
    submitted_here: bool
    job_name: str
    account: str
    user: str
    partition: str
    qos: str
    priority: int | None
    cancelled_by: str | None

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

    def as_json(self) -> dict[str, Any]:
        """As the REST shim writes it (snake case)."""
        return asdict(self)


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
