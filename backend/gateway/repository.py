"""All SQL of the agents domain."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Table, any_, bindparam, case, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import AgentCommand, StateTransition, Worker

WORKERS: Table = Worker.__table__  # type: ignore[assignment]


async def unacked_commands(
    session: AsyncSession, machine_id: int, after_id: int = 0
) -> list[AgentCommand]:
    rows = await session.scalars(
        select(AgentCommand)
        .where(
            AgentCommand.machine_id == machine_id,
            AgentCommand.acked_at.is_(None),
            AgentCommand.id > after_id,
        )
        .order_by(AgentCommand.id)
    )
    return list(rows)


async def watch_commands(session: AsyncSession, machine_id: int) -> list[AgentCommand]:
    """The newest WATCH of each worker placed on the machine now, of its current attempt."""
    rows = await session.execute(
        select(AgentCommand, Worker.attempt)
        .join(Worker, Worker.id == AgentCommand.worker_id)
        .where(
            AgentCommand.machine_id == machine_id,
            AgentCommand.kind == "watch",
            Worker.machine_id == machine_id,
        )
        .order_by(AgentCommand.id)
    )
    newest: dict[int | None, AgentCommand] = {}
    for command, attempt in rows:
        if command.payload.get("attempt") == attempt:
            newest[command.worker_id] = command
    return list(newest.values())


# At most this many ids in one IN (...): SQLite's bound parameters are limited.
IDS_PER_QUERY = 500
_IDS = ARRAY(BigInteger)


async def unacked_command_heads(
    session: AsyncSession, machine_ids: Collection[int]
) -> list[tuple[int, int]]:
    """(machine id, command id) of every unacknowledged command of these machines, in id
    order: the index's columns alone, one query per IDS_PER_QUERY machines."""
    wanted = sorted(machine_ids)
    heads: list[tuple[int, int]] = []
    if session.get_bind().dialect.name == "postgresql":
        # One array parameter however many machines (a poll every half second of a thousand
        # streams: an IN of a thousand parameters was rendered and bound each time).
        rows = await session.execute(
            select(AgentCommand.machine_id, AgentCommand.id).where(
                AgentCommand.machine_id == any_(bindparam("machines", wanted, type_=_IDS)),
                AgentCommand.acked_at.is_(None),
            )
        )
        heads.extend((int(m), int(c)) for m, c in rows)
        return sorted(heads, key=lambda head: head[1])
    for i in range(0, len(wanted), IDS_PER_QUERY):
        rows = await session.execute(
            select(AgentCommand.machine_id, AgentCommand.id).where(
                AgentCommand.machine_id.in_(wanted[i : i + IDS_PER_QUERY]),
                AgentCommand.acked_at.is_(None),
            )
        )
        heads.extend((int(m), int(c)) for m, c in rows)
    return sorted(heads, key=lambda head: head[1])


async def commands_by_id(session: AsyncSession, ids: Collection[int]) -> list[AgentCommand]:
    """These commands whole (their payloads), in id order."""
    wanted = sorted(ids)
    found: list[AgentCommand] = []
    for i in range(0, len(wanted), IDS_PER_QUERY):
        found.extend(
            await session.scalars(
                select(AgentCommand)
                .where(AgentCommand.id.in_(wanted[i : i + IDS_PER_QUERY]))
                .order_by(AgentCommand.id)
            )
        )
    return found


async def ack_commands(
    session: AsyncSession, machine_id: int, ids: Sequence[int], at: datetime
) -> None:
    """Acknowledged. The rows are locked first in id order, the order every other writer of
    commands takes them in (deleting a run, backend/runs/repository.py): an UPDATE alone
    locks them in the order it finds them, and two writers taking the same rows in opposite
    orders deadlock (PostgreSQL; SQLite's one write lock leaves FOR UPDATE out)."""
    locked = list(
        await session.scalars(
            select(AgentCommand.id)
            .where(AgentCommand.machine_id == machine_id, AgentCommand.id.in_(sorted(set(ids))))
            .order_by(AgentCommand.id)
            .with_for_update()
        )
    )
    if locked:
        await session.execute(
            update(AgentCommand).where(AgentCommand.id.in_(locked)).values(acked_at=at)
        )


async def set_aside_command(
    session: AsyncSession, machine_id: int, command_id: int, at: datetime
) -> AgentCommand | None:
    command = await session.scalar(
        select(AgentCommand).where(
            AgentCommand.id == command_id, AgentCommand.machine_id == machine_id
        )
    )
    if command is not None:
        command.acked_at = at
        await session.flush()
    return command


async def last_placements(
    session: AsyncSession, worker_ids: Collection[int]
) -> dict[int, tuple[int, list[int]]]:
    """Where each worker was placed last, (machine id, GPU ids), also after it ended (its row
    keeps them only while placed): the machine of its last transition that had one (as its log
    is found, lifecycle.repository.last_machine), the GPU ids of the last start command sent for it
    to that machine (the outbox keeps every command). Two queries for any number of workers."""
    wanted = sorted(worker_ids)
    machines: dict[int, int] = {}
    for i in range(0, len(wanted), IDS_PER_QUERY):
        last = (
            select(func.max(StateTransition.id).label("id"))
            .where(
                StateTransition.worker_id.in_(wanted[i : i + IDS_PER_QUERY]),
                StateTransition.machine_id.is_not(None),
            )
            .group_by(StateTransition.worker_id)
            .subquery()
        )
        rows = await session.execute(
            select(StateTransition.worker_id, StateTransition.machine_id).join(
                last, StateTransition.id == last.c.id
            )
        )
        machines.update({w: m for w, m in rows if w is not None and m is not None})
    placed: dict[int, tuple[int, list[int]]] = {w: (m, []) for w, m in machines.items()}
    if not machines:
        return placed
    starts = await session.execute(
        select(AgentCommand.worker_id, AgentCommand.machine_id, AgentCommand.payload)
        .where(
            AgentCommand.machine_id.in_(sorted(set(machines.values()))),
            AgentCommand.worker_id.in_(sorted(machines)),
            AgentCommand.kind == "start",
        )
        .order_by(AgentCommand.id)
    )
    for worker_id, machine_id, payload in starts:
        if worker_id is not None and machines.get(worker_id) == machine_id:
            placed[worker_id] = (machine_id, [int(g) for g in payload.get("gpu_ids") or []])
    return placed


async def workers_on_machine(session: AsyncSession, machine_id: int) -> list[Worker]:
    return list(await session.scalars(select(Worker).where(Worker.machine_id == machine_id)))


async def record_gpu_utilization(
    session: AsyncSession, machine_id: int, means: dict[int, float]
) -> None:
    """Fold each worker's newest mean GPU utilisation into its recent one (halving the old)."""
    for worker_id, mean in means.items():
        await session.execute(
            update(Worker)
            .where(Worker.machine_id == machine_id, Worker.id == worker_id)
            .values(
                gpu_utilization=case(
                    (Worker.gpu_utilization.is_(None), mean),
                    else_=(Worker.gpu_utilization + mean) / 2,
                )
            )
        )


# What a progress report reads of its worker, and may change.
PROGRESS_COLUMNS = (
    Worker.id,
    Worker.run_id,
    Worker.machine_id,
    Worker.attempt,
    Worker.rank,
    Worker.name,
    Worker.gpus,
    Worker.state,
    Worker.reason,
    Worker.phase,
    Worker.stop_cause,
    Worker.state_since,
    Worker.stalled_since,
    Worker.progress_at,
    Worker.progress_step,
    Worker.stepped_at,
    Worker.progress_rate,
    Worker.reached_step,
    Worker.checkpoint_step,
    Worker.redo_until,
)
PROGRESS_FIELDS = (
    "progress_at",
    "progress_step",
    "stepped_at",
    "progress_rate",
    "reached_step",
    "checkpoint_step",
)


async def lock_free_workers(session: AsyncSession, ids: Collection[int]) -> dict[int, Any]:
    """These workers' rows that no other transaction holds, locked (PostgreSQL: FOR NO KEY
    UPDATE SKIP LOCKED, in id order; SQLite's one writer holds them all), by id. Never waits:
    a row another transaction holds (a scheduling pass, a gang's change) is left out."""
    wanted = sorted(ids)
    found: dict[int, Any] = {}
    for i in range(0, len(wanted), IDS_PER_QUERY):
        rows = await session.execute(
            select(*PROGRESS_COLUMNS)
            .where(Worker.id.in_(wanted[i : i + IDS_PER_QUERY]))
            .order_by(Worker.id)
            .with_for_update(key_share=True, skip_locked=True)
        )
        found.update((row.id, row) for row in rows)
    return found


async def write_progress(session: AsyncSession, changes: Sequence[dict[str, Any]]) -> None:
    """Each worker's new progress fields (``id`` and PROGRESS_FIELDS): one executemany."""
    if changes:
        await session.execute(
            update(WORKERS)
            .where(WORKERS.c.id == bindparam("worker"))
            .values({f: bindparam(f"new_{f}") for f in PROGRESS_FIELDS}),
            [{"worker": c["id"], **{f"new_{f}": c[f] for f in PROGRESS_FIELDS}} for c in changes],
        )


async def record_gpu_utilizations(
    session: AsyncSession, means: dict[tuple[int, int], float]
) -> None:
    """As record_gpu_utilization, for many machines' workers ((machine id, worker id): mean)
    in one executemany."""
    if means:
        await session.execute(
            update(WORKERS)
            .where(
                WORKERS.c.id == bindparam("worker"), WORKERS.c.machine_id == bindparam("machine")
            )
            .values(
                gpu_utilization=case(
                    (WORKERS.c.gpu_utilization.is_(None), bindparam("mean")),
                    else_=(WORKERS.c.gpu_utilization + bindparam("mean")) / 2,
                )
            ),
            [{"worker": w, "machine": m, "mean": mean} for (m, w), mean in sorted(means.items())],
        )
