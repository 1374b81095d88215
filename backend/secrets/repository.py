"""All SQL of the secrets domain: a workspace's secrets, a placed worker's, every stored one
written again under the first key."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import Run, Secret, Webhook, Worker


async def secret_named(session: AsyncSession, workspace_id: int, name: str) -> Secret | None:
    return await session.scalar(
        select(Secret).where(Secret.workspace_id == workspace_id, Secret.name == name)
    )


async def secrets_of(session: AsyncSession, workspace_id: int) -> list[Secret]:
    rows = await session.scalars(
        select(Secret).where(Secret.workspace_id == workspace_id).order_by(Secret.name)
    )
    return list(rows)


async def secrets_named(session: AsyncSession, workspace_id: int, names: list[str]) -> list[Secret]:
    rows = await session.scalars(
        select(Secret).where(Secret.workspace_id == workspace_id, Secret.name.in_(names))
    )
    return list(rows)


async def placed_worker(session: AsyncSession, machine_id: int, worker_id: int) -> Worker | None:
    """The worker if it is placed on this machine."""
    return await session.scalar(
        select(Worker).where(Worker.id == worker_id, Worker.machine_id == machine_id)
    )


async def run_of(session: AsyncSession, worker: Worker) -> Run | None:
    return await session.get(Run, worker.run_id)


def add(session: AsyncSession, row: Secret) -> None:
    session.add(row)


async def delete(session: AsyncSession, row: Secret) -> None:
    await session.delete(row)


async def rewrite_stored_secrets(session: AsyncSession) -> int:
    """Read every secret value and webhook secret (any configured key opens it) and write it
    back (the first key encrypts it): how many were written."""
    written = 0
    for column in (Secret.value, Webhook.secret):
        table = column.class_
        rows = (await session.execute(select(table.id, column).where(column.is_not(None)))).all()
        for row_id, clear in rows:
            await session.execute(
                update(table).where(table.id == row_id).values({column.key: clear})
            )
            written += 1
    return written
