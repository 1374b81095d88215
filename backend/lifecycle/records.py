"""A run's or worker's state change kept in history with its event: what the lifecycle writes
outside its rules' effects (``persist`` writes those): a run created, a stop asked of a run
another scheduler runs, what that scheduler recorded (external.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.lifecycle.views import Transition
from backend.models import Event, Run, StateTransition, Worker, Workspace


def record_transition(
    session: AsyncSession,
    workspace: Workspace,
    run: Run,
    worker: Worker | None,
    state: str,
    reason: str,
    at: datetime,
    *,
    phase: str | None = None,
    held: bool = False,
) -> None:
    """Keep a state change in history and publish it as an event of the workspace (the event's
    data empty). A worker ``held`` from here holds its GPUs on its machine. For changes made
    outside the lifecycle's rules: a run created (runs), asked to stop while Slurm runs it, and
    what Slurm recorded of a job (backend/slurm/jobs.py): every transition is written here or
    by ``persist``."""
    change = Transition(
        run_id=run.id,
        worker_id=worker.id if worker else None,
        at=at,
        state=state,
        reason=reason,
        phase=phase,
        held_gpus=worker.gpus if worker and held else 0,
        gpus=worker.gpus if worker else 0,
        machine_id=worker.machine_id if worker and held else None,
    )
    transition, event = change.rows(
        workspace.organization_id, workspace.id, run.name, worker.name if worker else None, {}
    )
    session.add_all([StateTransition(**transition), Event(**event)])
