"""All SQL of the runs domain."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.lifecycle.states import ENDED_RUN_STATES
from backend.models import (
    AgentCommand,
    Cluster,
    Event,
    Machine,
    Run,
    Secret,
    StateTransition,
    User,
    Worker,
)


async def get_live_run_by_name(session: AsyncSession, workspace_id: int, name: str) -> Run | None:
    return await session.scalar(
        select(Run).where(
            Run.workspace_id == workspace_id, Run.name == name, Run.deleted_at.is_(None)
        )
    )


async def worker_by_name(
    session: AsyncSession, workspace_id: int, name: str
) -> tuple[Run, Worker] | None:
    row = (
        await session.execute(
            select(Run, Worker)
            .join(Worker, Worker.run_id == Run.id)
            .where(Run.workspace_id == workspace_id, Run.deleted_at.is_(None), Worker.name == name)
            .order_by(Run.id.desc())
            .limit(1)
        )
    ).first()
    return None if row is None else (row[0], row[1])


async def get_run(session: AsyncSession, run_id: int) -> Run | None:
    return await session.get(Run, run_id)


async def list_runs(session: AsyncSession, workspace_id: int, *, include_ended: bool) -> list[Run]:
    query = select(Run).where(Run.workspace_id == workspace_id)
    if not include_ended:
        query = query.where(Run.state.not_in([s.value for s in ENDED_RUN_STATES]))
    rows = await session.scalars(query.order_by(Run.created_at.desc(), Run.id.desc()))
    return list(rows)


async def workers_by_run(session: AsyncSession, run_ids: Sequence[int]) -> dict[int, list[Worker]]:
    rows = await session.scalars(
        select(Worker).where(Worker.run_id.in_(run_ids)).order_by(Worker.run_id, Worker.rank)
    )
    grouped: dict[int, list[Worker]] = defaultdict(list)
    for worker in rows:
        grouped[worker.run_id].append(worker)
    return grouped


async def run_history(
    session: AsyncSession, run_ids: Sequence[int]
) -> dict[int, list[StateTransition]]:
    """The runs' own transitions (not their workers'), oldest first."""
    rows = await session.scalars(
        select(StateTransition)
        .where(StateTransition.run_id.in_(run_ids), StateTransition.worker_id.is_(None))
        .order_by(StateTransition.run_id, StateTransition.transition_at, StateTransition.id)
    )
    grouped: dict[int, list[StateTransition]] = defaultdict(list)
    for row in rows:
        grouped[row.run_id].append(row)
    return grouped


async def worker_history(
    session: AsyncSession, worker_ids: Sequence[int]
) -> dict[int, list[StateTransition]]:
    """Each worker's own transitions, newest first (seed L-43)."""
    rows = await session.scalars(
        select(StateTransition)
        .where(StateTransition.worker_id.in_(worker_ids))
        .order_by(
            StateTransition.worker_id,
            StateTransition.transition_at.desc(),
            StateTransition.id.desc(),
        )
    )
    grouped: dict[int, list[StateTransition]] = defaultdict(list)
    for row in rows:
        assert row.worker_id is not None
        grouped[row.worker_id].append(row)
    return grouped


async def needing_attention(session: AsyncSession, workspace_id: int) -> list[tuple[Worker, Run]]:
    """Running workers of the workspace's live runs that are stalled or slow now."""
    rows = await session.execute(
        select(Worker, Run)
        .join(Run, Run.id == Worker.run_id)
        .where(
            Run.workspace_id == workspace_id,
            Run.deleted_at.is_(None),
            Worker.state == "Running",
            (Worker.stalled_since.is_not(None)) | (Worker.slow_since.is_not(None)),
        )
        .order_by(Run.name, Worker.rank)
    )
    return [(r[0], r[1]) for r in rows]


async def runs_by_id(session: AsyncSession, run_ids: Sequence[int]) -> dict[int, Run]:
    return {r.id: r for r in await session.scalars(select(Run).where(Run.id.in_(run_ids)))}


async def user_names(session: AsyncSession, user_ids: Sequence[int]) -> dict[int, str]:
    rows = await session.execute(select(User.id, User.name).where(User.id.in_(user_ids)))
    return {row.id: row.name for row in rows}


async def machine_names(session: AsyncSession, machine_ids: Sequence[int]) -> dict[int, str]:
    rows = await session.execute(
        select(Machine.id, Machine.name).where(Machine.id.in_(machine_ids))
    )
    return {row.id: row.name for row in rows}


async def cluster_names(session: AsyncSession, cluster_ids: Sequence[int]) -> dict[int, str]:
    rows = await session.execute(
        select(Cluster.id, Cluster.name).where(Cluster.id.in_(cluster_ids))
    )
    return {row.id: row.name for row in rows}


def add(session: AsyncSession, *rows: Run | Worker | StateTransition | Event) -> None:
    session.add_all(rows)


async def secret_names(session: AsyncSession, workspace_id: int) -> set[str]:
    names = await session.scalars(select(Secret.name).where(Secret.workspace_id == workspace_id))
    return set(names)


async def lock_for_deletion(session: AsyncSession, run_id: int) -> None:
    """Lock the run, then its workers, then the commands naming them (as ``DELETE FROM
    workers`` will set them aside), each kind in id order (PostgreSQL; SQLite's write
    transaction holds the one lock already, and leaves FOR UPDATE out)."""
    await session.execute(select(Run.id).where(Run.id == run_id).with_for_update())
    workers = list(
        await session.scalars(
            select(Worker.id).where(Worker.run_id == run_id).order_by(Worker.id).with_for_update()
        )
    )
    if workers:
        await session.execute(
            select(AgentCommand.id)
            .where(AgentCommand.worker_id.in_(workers))
            .order_by(AgentCommand.id)
            .with_for_update()
        )
