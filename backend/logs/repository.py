"""All SQL of the logs domain."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import Run, Worker


async def worker_in_workspace(session: AsyncSession, workspace_id: int, name: str) -> Worker | None:
    return await session.scalar(
        select(Worker)
        .join(Run, Run.id == Worker.run_id)
        .where(Run.workspace_id == workspace_id, Run.deleted_at.is_(None), Worker.name == name)
    )
