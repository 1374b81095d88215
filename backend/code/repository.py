"""The code archives' tables: an archive of a workspace by digest, its chunks in order, the one
a machine may fetch, and those past their retention."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, exists, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.lifecycle.states import ENDED_RUN_STATES
from backend.models import CodeArchive, CodeChunk, Run, Worker


async def archive(session: AsyncSession, workspace_id: int, hex_digest: str) -> CodeArchive | None:
    return await session.scalar(
        select(CodeArchive).where(
            CodeArchive.workspace_id == workspace_id, CodeArchive.digest == hex_digest
        )
    )


async def archives(session: AsyncSession, ids: Sequence[int]) -> dict[int, CodeArchive]:
    rows = await session.scalars(select(CodeArchive).where(CodeArchive.id.in_(ids)))
    return {row.id: row for row in rows}


def add(session: AsyncSession, row: CodeArchive) -> None:
    session.add(row)


async def add_chunk(session: AsyncSession, archive_id: int, seq: int, data: bytes) -> None:
    """One chunk, written at once and not kept in the session (an archive's chunks together
    are as large as it)."""
    await session.execute(insert(CodeChunk).values(archive_id=archive_id, seq=seq, data=data))


async def touch(session: AsyncSession, archive_id: int, at: datetime) -> None:
    await session.execute(
        update(CodeArchive).where(CodeArchive.id == archive_id).values(used_at=at)
    )


async def chunk(session: AsyncSession, archive_id: int, seq: int) -> bytes | None:
    return await session.scalar(
        select(CodeChunk.data).where(CodeChunk.archive_id == archive_id, CodeChunk.seq == seq)
    )


async def placed_archive(
    session: AsyncSession, machine_id: int, worker_id: int, attempt: int, hex_digest: str
) -> CodeArchive | None:
    """The archive of the run of a worker placed on this machine, at this attempt, where its
    run ships with the code of this digest; else None (another machine's worker, an earlier
    attempt, a digest its run does not name, another workspace's archive)."""
    return await session.scalar(
        select(CodeArchive)
        .join(Run, Run.code_id == CodeArchive.id)
        .join(Worker, Worker.run_id == Run.id)
        .where(
            Worker.id == worker_id,
            Worker.machine_id == machine_id,
            Worker.attempt == attempt,
            CodeArchive.digest == hex_digest,
            CodeArchive.workspace_id == Run.workspace_id,
        )
    )


async def prune(session: AsyncSession, used_before: datetime) -> int:
    """Archives last used before ``used_before`` that no live run ships with: their runs
    forget them (Run again says the code is gone), their chunks and themselves go. How many."""
    live = exists().where(
        Run.code_id == CodeArchive.id, Run.state.not_in([s.value for s in ENDED_RUN_STATES])
    )
    gone = list(
        await session.scalars(
            select(CodeArchive.id).where(CodeArchive.used_at < used_before, ~live)
        )
    )
    if not gone:
        return 0
    await session.execute(update(Run).where(Run.code_id.in_(gone)).values(code_id=None))
    await session.execute(delete(CodeChunk).where(CodeChunk.archive_id.in_(gone)))
    await session.execute(delete(CodeArchive).where(CodeArchive.id.in_(gone)))
    return len(gone)
