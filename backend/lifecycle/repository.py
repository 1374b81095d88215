"""All SQL of the lifecycle domain."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Row, Table, bindparam, delete, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.db.bulk import update_many
from backend.db.types import UTCDateTime
from backend.lifecycle.states import ENDED_RUN_STATES, WORKER_ENDED_STATES
from backend.lifecycle.views import CheckpointSeen, Restarted
from backend.models import (
    AgentCommand,
    Checkpoint,
    Event,
    Machine,
    Redo,
    Run,
    SlurmImport,
    StateTransition,
    Worker,
    WorkerSeenLines,
    Workspace,
)

# Read as tables, not mapped classes: plain rows, without the ORM's work per row.
RUNS = cast(Table, Run.__table__)
WORKERS = cast(Table, Worker.__table__)
WORKSPACES = cast(Table, Workspace.__table__)
MACHINES = cast(Table, Machine.__table__)

# A worker's last lines seen on a machine: (worker id, machine id, text, seen at).
SeenRow = tuple[int, int, str, datetime]


async def gang_rows(
    session: AsyncSession, run_ids: Sequence[int], *, lock: bool
) -> tuple[list[Row[Any]], dict[int, list[Row[Any]]]]:
    """The runs by id, each with its workspace's ``organization_id``, locked for update (the
    runs alone), and their workers by run and rank, each with its machine's ``machine_name``:
    every column, as plain rows (a first scheduling pass places 1 348 gangs at once)."""
    runs = (
        select(RUNS, WORKSPACES.c.organization_id)
        .join(WORKSPACES, WORKSPACES.c.id == RUNS.c.workspace_id)
        .where(RUNS.c.id.in_(run_ids))
        .order_by(RUNS.c.id)
    )
    if lock:
        runs = runs.with_for_update(of=RUNS)
    found = list((await session.execute(runs)).all())
    workers = await session.execute(
        select(WORKERS, MACHINES.c.name.label("machine_name"))
        .outerjoin(MACHINES, MACHINES.c.id == WORKERS.c.machine_id)
        .where(WORKERS.c.run_id.in_([r.id for r in found]))
        .order_by(WORKERS.c.run_id, WORKERS.c.rank)
    )
    grouped: dict[int, list[Row[Any]]] = {}
    for worker in workers.all():
        grouped.setdefault(worker.run_id, []).append(worker)
    return found, grouped


async def update_runs(session: AsyncSession, changes: dict[int, dict[str, Any]]) -> None:
    await update_many(session, Run, changes)


async def update_workers(session: AsyncSession, changes: dict[int, dict[str, Any]]) -> None:
    await update_many(session, Worker, changes)


async def runs_by_id(session: AsyncSession, run_ids: Sequence[int], *, lock: bool) -> list[Run]:
    query = select(Run).where(Run.id.in_(run_ids)).order_by(Run.id)
    if lock:
        query = query.with_for_update()
    return list(await session.scalars(query))


async def slurm_reads(session: AsyncSession) -> dict[int, datetime | None]:
    """When each Slurm-backed cluster's import last read its Slurm (None: never)."""
    rows = await session.execute(select(SlurmImport.cluster_id, SlurmImport.imported_at))
    return {r.cluster_id: r.imported_at for r in rows}


async def live_run_ids(session: AsyncSession) -> list[int]:
    rows = await session.scalars(
        select(Run.id).where(Run.state.not_in([s.value for s in ENDED_RUN_STATES]))
    )
    return list(rows)


async def run_ids_on_machine(session: AsyncSession, machine_id: int) -> list[int]:
    rows = await session.scalars(
        select(Worker.run_id).where(Worker.machine_id == machine_id).distinct()
    )
    return list(rows)


async def placed_worker(session: AsyncSession, machine_id: int, worker_id: int) -> Worker | None:
    """The worker with this id, when it is placed on this machine (else None)."""
    return await session.scalar(
        select(Worker).where(Worker.id == worker_id, Worker.machine_id == machine_id)
    )


async def machines_that_ran(session: AsyncSession, run_id: int) -> set[int]:
    """Every machine a worker of the run was placed on: each keeps logs of it."""
    rows = await session.scalars(
        select(StateTransition.machine_id)
        .where(StateTransition.run_id == run_id, StateTransition.machine_id.is_not(None))
        .distinct()
    )
    return {m for m in rows if m is not None}


async def move_workers(session: AsyncSession, moves: Sequence[tuple[int, int, str]]) -> int:
    """Write each (worker id, attempt, new state) unless that attempt has ended in the
    database: a conditional UPDATE, so of two transactions that both saw the worker alive,
    the one that comes second finds it ended and changes nothing (terminal states are
    terminal, whatever the isolation). How many were written."""
    written = 0
    groups: dict[tuple[int, str], list[int]] = {}
    for worker_id, attempt, state in moves:
        groups.setdefault((attempt, state), []).append(worker_id)
    for (attempt, state), ids in groups.items():
        result = await session.execute(
            update(Worker)
            .where(
                Worker.id.in_(ids),
                ~((Worker.attempt == attempt) & Worker.state.in_(sorted(WORKER_ENDED_STATES))),
            )
            .values(state=state)
            .execution_options(synchronize_session=False)
        )
        written += int(getattr(result, "rowcount", 0) or 0)
    return written


async def delete_workers(session: AsyncSession, run_id: int) -> None:
    await session.execute(delete(Worker).where(Worker.run_id == run_id))


def add(
    session: AsyncSession, *rows: StateTransition | Event | AgentCommand | Run | Worker
) -> None:
    session.add_all(rows)


async def clear_pending_commands(
    session: AsyncSession, worker_ids: Sequence[int], at: datetime
) -> None:
    """Set aside the workers' commands no machine has carried out yet, but their deletes: a
    deleted run's start that never reached its machine is never sent. The rows are locked first
    in id order, as every writer of commands takes them (gateway.repository.ack_commands): an
    UPDATE alone locks them in the order it finds them and can deadlock with an acknowledgement."""
    if not worker_ids:
        return
    locked = list(
        await session.scalars(
            select(AgentCommand.id)
            .where(
                AgentCommand.target_worker_id.in_(worker_ids),
                AgentCommand.acked_at.is_(None),
                AgentCommand.kind != "delete",
            )
            .order_by(AgentCommand.id)
            .with_for_update()
        )
    )
    if locked:
        await session.execute(
            update(AgentCommand).where(AgentCommand.id.in_(locked)).values(acked_at=at)
        )


async def placements(session: AsyncSession, worker_id: int, until: datetime) -> list[int]:
    """The machines a worker was placed on, one per attempt, in order, up to ``until``: the
    "Placed on" transition each placement writes (lifecycle.starting.place)."""
    rows = await session.scalars(
        select(StateTransition.machine_id)
        .where(
            StateTransition.worker_id == worker_id,
            StateTransition.machine_id.is_not(None),
            StateTransition.phase.in_(["starting", "restart"]),
            StateTransition.reason.like("Placed on %"),
            StateTransition.transition_at <= until,
        )
        .order_by(StateTransition.id)
    )
    return [m for m in rows if m is not None]


async def last_machine(session: AsyncSession, worker_id: int) -> int | None:
    """The machine the worker last held its GPUs on (its history's newest held change): it
    keeps the worker's log."""
    return await session.scalar(
        select(StateTransition.machine_id)
        .where(StateTransition.worker_id == worker_id, StateTransition.machine_id.is_not(None))
        .order_by(StateTransition.id.desc())
        .limit(1)
    )


async def run_of_worker(session: AsyncSession, worker_id: int) -> int | None:
    return await session.scalar(select(Worker.run_id).where(Worker.id == worker_id))


async def worker_by_id(session: AsyncSession, worker_id: int) -> Worker | None:
    """The worker as the database has it now: read again after a lock (flush first: what the
    session changed and did not write would be read over)."""
    return await session.scalar(
        select(Worker).where(Worker.id == worker_id).execution_options(populate_existing=True)
    )


async def restarted(session: AsyncSession, workspace_id: int, restart: Restarted) -> None:
    """A restart ends the run's redo still open (it did not reach its step again) and opens
    one of its own."""
    await session.execute(
        update(Redo)
        .where(Redo.run_id == restart.run_id, Redo.until.is_(None))
        .values(until=restart.at)
    )
    session.add(
        Redo(
            run_id=restart.run_id,
            workspace_id=workspace_id,
            attempt=restart.attempt,
            restarted_at=restart.at,
            reached_step=restart.reached_step,
            checkpoint_step=restart.checkpoint_step,
            caught_up=False,
        )
    )
    await session.flush()


def add_checkpoints(session: AsyncSession, run_id: int, seen: Sequence[CheckpointSeen]) -> None:
    """The checkpoints its workers reported (the checkpoint advice reads them)."""
    session.add_all(
        Checkpoint(run_id=run_id, worker_id=c.worker_id, step=c.step, at=c.at, cost_s=c.cost_s)
        for c in seen
    )


async def prune_checkpoints(session: AsyncSession, before: datetime) -> int:
    """The checkpoints reported before ``before`` deleted: how many."""
    found = await session.execute(delete(Checkpoint).where(Checkpoint.at < before))
    return int(getattr(found, "rowcount", 0) or 0)


async def caught_up(session: AsyncSession, run_id: int, at: datetime) -> None:
    """A worker of the run reached its run's highest step again: its open redo ends there."""
    await session.execute(
        update(Redo)
        .where(Redo.run_id == run_id, Redo.until.is_(None), Redo.restarted_at <= at)
        .values(until=at, caught_up=True)
    )


# A worker's last lines seen, kept where the worker still exists (one deleted meanwhile is not
# written again); its newer lines replace its older.
_KEEP_SEEN = text(
    "INSERT INTO worker_seen_lines (worker_id, machine_id, text, seen_at) "
    "SELECT id, :machine, :text, :at FROM workers WHERE id = :worker "
    "ON CONFLICT (worker_id) DO UPDATE SET machine_id = excluded.machine_id, "
    "text = excluded.text, seen_at = excluded.seen_at"
).bindparams(bindparam("at", type_=UTCDateTime()))


async def keep_seen_lines(session: AsyncSession, seen: Sequence[SeenRow]) -> None:
    """Each (worker, machine, text, seen at): that worker's last lines seen on that machine."""
    await session.execute(
        _KEEP_SEEN,
        [{"worker": w, "machine": m, "text": t, "at": at} for w, m, t, at in seen],
    )


async def seen_lines(session: AsyncSession, machine_id: int) -> dict[int, tuple[str, datetime]]:
    """The last lines seen of each worker on the machine, and when: by worker id."""
    rows = await session.execute(
        select(WorkerSeenLines.worker_id, WorkerSeenLines.text, WorkerSeenLines.seen_at).where(
            WorkerSeenLines.machine_id == machine_id
        )
    )
    return {int(w): (t, at) for w, t, at in rows}


async def forget_seen_lines(
    session: AsyncSession, *, machine_id: int | None = None, worker_id: int | None = None
) -> None:
    """The lines seen on a machine, or of a worker, are no longer anyone's to keep."""
    statement = delete(WorkerSeenLines)
    if machine_id is not None:
        statement = statement.where(WorkerSeenLines.machine_id == machine_id)
    if worker_id is not None:
        statement = statement.where(WorkerSeenLines.worker_id == worker_id)
    await session.execute(statement)
