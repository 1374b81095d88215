"""A run on a Slurm cluster with its Slurm job's row, written straight into the database, for
the tests of where the job is shown (issue 38); tests/support/slurm.py runs a real Slurm."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from backend.db import Database
from backend.models import Cluster, Organization, Run, SlurmRun
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy

# What the job's row holds (besides its run): a job Astraeus submitted, as squeue and sacct
# describe it, cancelled by root. Slurm's priorities are unsigned 32-bit numbers.
JOB: dict[str, Any] = {
    "job_id": "12",
    "submitted": True,
    "job_name": "llama-sft",
    "account": "nlp",
    "user": "alice",
    "partition": "gpu",
    "qos": "normal",
    "priority": 4294901759,
    "cancelled_by": "root",
}


async def slurm_cluster(db: Database, clock: FakeClock, name: str = "hpc") -> int:
    """A Slurm cluster of organisation 'default' (its import never runs in these tests)."""
    async with db.transaction() as session:
        org = await session.scalar(select(Organization.id).where(Organization.name == "default"))
        assert org is not None
        cluster = Cluster(
            organization_id=org,
            name=name,
            slurm={"conf": "/etc/slurm/slurm.conf"},
            created_at=clock.now(),
        )
        session.add(cluster)
        await session.flush()
        return cluster.id


async def slurm_run(
    db: Database, clock: FakeClock, tenancy: Tenancy, name: str = "llama-sft", **job: Any
) -> Run:
    """A run submitted to cluster 'hpc' (made if it is not there) by alice, and its job's row:
    ``JOB`` with ``job``'s changes. ``applied`` is the import's own: never shown."""
    async with db.read() as session:
        found = await session.scalar(select(Cluster.id).where(Cluster.name == "hpc"))
    if found is None:
        await slurm_cluster(db, clock)
    run = await World(db, clock, tenancy).submit(
        name=name, cluster="hpc", workers=1, gpus=1, command=["python", "train.py"]
    )
    async with db.transaction() as session:
        session.add(SlurmRun(run_id=run.id, applied=7, **(JOB | job)))
    return run
