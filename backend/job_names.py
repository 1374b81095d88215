"""The jobs a unit of work may ask for once it commits (``backend.db.after_commit``), named
below every domain: a domain that frees GPUs or queues a run asks for a scheduling pass without
importing the scheduler, and the scheduler is never imported back (the domains' layers,
pyproject.toml). The actors themselves are in backend/jobs/actors.py."""

from __future__ import annotations

# The scheduling pass: places waiting runs (backend.scheduling.service).
PASS_JOB = "scheduling.pass"

# A Slurm cluster's import: submits the cluster's runs and reads its jobs (backend.slurm).
SLURM_JOB = "slurm.import"
