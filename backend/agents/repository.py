"""All SQL of the agents domain."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import case, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import AgentCommand, Worker


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


async def ack_commands(
    session: AsyncSession, machine_id: int, ids: Sequence[int], at: datetime
) -> None:
    await session.execute(
        update(AgentCommand)
        .where(AgentCommand.machine_id == machine_id, AgentCommand.id.in_(ids))
        .values(acked_at=at)
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
