"""What the Slurm import reads and writes: Slurm-backed clusters, the accounts' workspaces, where
each import stands, the runs imported (by job id), and the nodes as machines of the cluster."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.lifecycle.states import ENDED_RUN_STATES
from backend.models import (
    AgentCommand,
    Cluster,
    Gpu,
    Machine,
    Pool,
    Run,
    SlurmAccount,
    SlurmImport,
    SlurmRun,
    StateTransition,
    Worker,
    Workspace,
)


def add(session: AsyncSession, *rows: object) -> None:
    session.add_all(rows)


async def slurm_cluster_ids(session: AsyncSession) -> list[int]:
    rows = await session.scalars(
        select(Cluster.id).where(Cluster.slurm.is_not(None)).order_by(Cluster.id)
    )
    return list(rows)


async def cluster(session: AsyncSession, cluster_id: int) -> Cluster | None:
    return await session.get(Cluster, cluster_id)


async def lock_import(session: AsyncSession, cluster_id: int) -> SlurmImport | None:
    """The cluster's import row, locked until commit: one import of a cluster at a time."""
    return await session.scalar(
        select(SlurmImport).where(SlurmImport.cluster_id == cluster_id).with_for_update()
    )


async def import_row(session: AsyncSession, cluster_id: int) -> SlurmImport | None:
    return await session.get(SlurmImport, cluster_id)


async def accounts(session: AsyncSession, cluster_id: int) -> list[tuple[SlurmAccount, Workspace]]:
    rows = await session.execute(
        select(SlurmAccount, Workspace)
        .join(Workspace, Workspace.id == SlurmAccount.workspace_id)
        .where(SlurmAccount.cluster_id == cluster_id)
        .order_by(SlurmAccount.account)
    )
    return [(a, w) for a, w in rows.all()]


async def account(session: AsyncSession, cluster_id: int, name: str) -> SlurmAccount | None:
    return await session.scalar(
        select(SlurmAccount).where(
            SlurmAccount.cluster_id == cluster_id, SlurmAccount.account == name
        )
    )


async def imported_runs(
    session: AsyncSession, cluster_id: int, job_ids: Sequence[str]
) -> dict[str, Run]:
    """The runs of these jobs, locked (a user's delete or a second import waits)."""
    out: dict[str, Run] = {}
    ids = list(job_ids)
    for start in range(0, len(ids), 1000):
        rows = await session.scalars(
            select(Run)
            .where(Run.cluster_id == cluster_id, Run.external_id.in_(ids[start : start + 1000]))
            .order_by(Run.id)
            .with_for_update()
        )
        for run in rows:
            assert run.external_id is not None
            out[run.external_id] = run
    return out


async def slurm_runs(session: AsyncSession, run_ids: Sequence[int]) -> dict[int, SlurmRun]:
    """The Slurm jobs of these runs, by run."""
    out: dict[int, SlurmRun] = {}
    ids = list(run_ids)
    for start in range(0, len(ids), 1000):
        rows = await session.scalars(
            select(SlurmRun).where(SlurmRun.run_id.in_(ids[start : start + 1000]))
        )
        out.update({r.run_id: r for r in rows})
    return out


async def live_job_ids(session: AsyncSession, cluster_id: int) -> list[str]:
    """The Slurm jobs whose imported runs have not ended here."""
    rows = await session.scalars(
        select(Run.external_id).where(
            Run.cluster_id == cluster_id,
            Run.external_id.is_not(None),
            Run.state.not_in(ENDED_RUN_STATES),
        )
    )
    return [r for r in rows if r is not None]


async def unsubmitted(session: AsyncSession, cluster_id: int) -> list[tuple[Run, Workspace]]:
    """Runs submitted here to the cluster and not yet to Slurm, oldest first."""
    rows = await session.execute(
        select(Run, Workspace)
        .join(Workspace, Workspace.id == Run.workspace_id)
        .where(
            Run.cluster_id == cluster_id,
            Run.external_id.is_(None),
            Run.state == "Pending",
            Run.deleted_at.is_(None),
        )
        .order_by(Run.id)
    )
    return [(r, w) for r, w in rows.all()]


async def asked_to_stop(session: AsyncSession, cluster_id: int) -> list[str]:
    rows = await session.scalars(
        select(Run.external_id).where(
            Run.cluster_id == cluster_id,
            Run.external_id.is_not(None),
            Run.stop_cause == "owner",
            Run.state.not_in(ENDED_RUN_STATES),
        )
    )
    return [r for r in rows if r is not None]


async def last_change_at(session: AsyncSession, run_id: int) -> datetime | None:
    """When the run's history was last written (a stop asked here is written at its time,
    not Slurm's: the job's end, in whole seconds, may read earlier)."""
    return await session.scalar(
        select(func.max(StateTransition.transition_at)).where(StateTransition.run_id == run_id)
    )


async def restate_stop(session: AsyncSession, run_id: int, asked_at: datetime, state: str) -> None:
    """The run's row of a stop asked here, written in the state the run was known in then,
    given the state Slurm's job was in at that moment (read later, dated earlier)."""
    await session.execute(
        update(StateTransition)
        .where(
            StateTransition.run_id == run_id,
            StateTransition.worker_id.is_(None),
            StateTransition.transition_at == asked_at,
            StateTransition.reason.like("Stopping: asked by %"),
        )
        .values(state=state)
    )


async def end_watches(session: AsyncSession, worker_ids: Sequence[int], at: datetime) -> None:
    """The workers' jobs ended on their nodes (or were queued again): their WATCH no agent
    took is set aside (never sent), and where an agent took it, it is told to stop watching
    (a STOP; it stops by itself once the processes are gone, and may have). Rows are locked
    in id order, as every writer of commands takes them (lifecycle.clear_pending_commands)."""
    if not worker_ids:
        return
    rows = list(
        await session.scalars(
            select(AgentCommand)
            .where(AgentCommand.worker_id.in_(worker_ids), AgentCommand.kind == "watch")
            .order_by(AgentCommand.id)
            .with_for_update()
        )
    )
    newest = {c.worker_id: c for c in rows}
    taken = [(w, c) for w, c in newest.items() if c.acked_at is not None]  # its agent has it
    for command in rows:
        if command.acked_at is None:
            command.acked_at = at
    for worker_id, command in taken:
        session.add(
            AgentCommand(
                machine_id=command.machine_id,
                worker_name=command.worker_name,
                target_worker_id=worker_id,
                worker_id=worker_id,
                kind="stop",
                payload={"watched": True},
                created_at=at,
            )
        )


async def stalled_jobs(session: AsyncSession, cluster_id: int) -> list[tuple[str, datetime | None]]:
    """The jobs of runs whose stall is to restart them (the lifecycle said so: stop cause
    "stall"), still running: each with when it is to start again, or None: its restarts spent,
    it is cancelled."""
    rows = await session.execute(
        select(Run.external_id, Run.restart_at).where(
            Run.cluster_id == cluster_id,
            Run.external_id.is_not(None),
            Run.stop_cause == "stall",
            Run.state == "Running",
        )
    )
    return [(job, restart_at) for job, restart_at in rows if job is not None]


async def lock_run(session: AsyncSession, run_id: int) -> Run | None:
    return await session.scalar(select(Run).where(Run.id == run_id).with_for_update())


async def workers_of(session: AsyncSession, run_ids: Sequence[int]) -> dict[int, list[Worker]]:
    out: dict[int, list[Worker]] = {r: [] for r in run_ids}
    ids = list(run_ids)
    for start in range(0, len(ids), 1000):
        rows = await session.scalars(
            select(Worker)
            .where(Worker.run_id.in_(ids[start : start + 1000]))
            .order_by(Worker.run_id, Worker.rank)
        )
        for w in rows:
            out[w.run_id].append(w)
    return out


async def machines(session: AsyncSession, cluster_id: int) -> dict[str, Machine]:
    rows = await session.scalars(select(Machine).where(Machine.cluster_id == cluster_id))
    return {m.name: m for m in rows}


async def pools(session: AsyncSession, cluster_id: int) -> dict[str, Pool]:
    rows = await session.scalars(select(Pool).where(Pool.cluster_id == cluster_id))
    return {p.name: p for p in rows}


async def gpus_of(session: AsyncSession, machine_ids: Sequence[int]) -> dict[int, list[Gpu]]:
    out: dict[int, list[Gpu]] = {m: [] for m in machine_ids}
    if not machine_ids:
        return out
    rows = await session.scalars(
        select(Gpu).where(Gpu.machine_id.in_(list(machine_ids))).order_by(Gpu.index)
    )
    for g in rows:
        out[g.machine_id].append(g)
    return out


async def delete(session: AsyncSession, *rows: object) -> None:
    for row in rows:
        await session.delete(row)


async def live_names(session: AsyncSession, workspace_id: int, names: Sequence[str]) -> set[str]:
    """Which of these names live runs of the workspace already have."""
    if not names:
        return set()
    rows = await session.scalars(
        select(Run.name).where(
            Run.workspace_id == workspace_id,
            Run.deleted_at.is_(None),
            Run.name.in_(list(names)),
        )
    )
    return set(rows)


def first_import(cluster_id: int, since: datetime) -> SlurmImport:
    return SlurmImport(cluster_id=cluster_id, since=since, unmapped={}, quarantined={})
