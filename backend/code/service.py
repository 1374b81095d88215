"""Code archives: stored from an upload (checked, once per workspace), named by a run at its
submission, fetched chunk by chunk by a machine running a worker of that run, pruned past their
retention."""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.clock import Clock
from backend.code import repository
from backend.code.rules import (
    CHUNK_BYTES,
    ArchiveFacts,
    ArchiveRefused,
    digest_of,
    hex_of,
    short,
    unpack,
)
from backend.db import Database
from backend.errors import FieldError, InvalidInput, NotFound
from backend.models import CodeArchive
from backend.organizations import service as organizations

# An archive read back is kept in memory up to this size, on disk beyond.
SPOOL_IN_MEMORY = 4 * 2**20
# An archive no live run ships with, last uploaded or named by a submission this long ago, goes.
RETENTION = timedelta(days=30)


@dataclass(frozen=True)
class Stored:
    archive: CodeArchive
    created: bool  # False: the workspace had it already (the same content is one copy)


def no_such_code(hex_digest: str) -> NotFound:
    """The same answer whether another workspace has it or none does."""
    return NotFound("CODE_NOT_FOUND", f"No code {digest_of(hex_digest)} in this workspace.")


def parse_digest(digest: str, field: str = "digest") -> str:
    found = hex_of(digest)
    if found is None:
        reason = "must be sha256: and 64 hexadecimal digits, the SHA-256 of the archive"
        raise InvalidInput("INVALID_DIGEST", [FieldError(field, reason)])
    return found


async def find(
    session: AsyncSession, principal: Principal, digest: str, workspace: str | None = None
) -> CodeArchive:
    hex_digest = parse_digest(digest)
    ws = await organizations.workspace_for(session, principal, workspace)
    found = await repository.archive(session, ws.id, hex_digest)
    if found is None:
        raise no_such_code(hex_digest)
    return found


async def store(
    session: AsyncSession,
    clock: Clock,
    workspace_id: int,
    hex_digest: str,
    body: IO[bytes],
    archive_bytes: int,
    facts: ArchiveFacts,
) -> Stored:
    """Keep an archive already checked (its digest and contents, backend/code/rules.py) for the
    workspace: a chunk a row, read from ``body``; the workspace's copy when it has one."""
    now = clock.now()
    existing = await repository.archive(session, workspace_id, hex_digest)
    if existing is not None:
        await repository.touch(session, existing.id, now)
        return Stored(existing, created=False)
    row = CodeArchive(
        workspace_id=workspace_id,
        digest=hex_digest,
        archive_bytes=archive_bytes,
        size=facts.size,
        files=facts.files,
        chunks=-(-archive_bytes // CHUNK_BYTES),
        uploaded_at=now,
        used_at=now,
    )
    repository.add(session, row)
    await session.flush()
    body.seek(0)
    seq = 0
    while piece := body.read(CHUNK_BYTES):  # a chunk at a time: never the whole in memory
        await repository.add_chunk(session, row.id, seq, piece)
        seq += 1
    return Stored(row, created=True)


async def for_submission(
    session: AsyncSession, clock: Clock, workspace_id: int, digest: str
) -> CodeArchive:
    """The archive a run submitted to this workspace ships with: refused, naming the field,
    where the workspace has none of that digest (another workspace's is none of its own)."""
    hex_digest = parse_digest(digest, "code")
    found = await repository.archive(session, workspace_id, hex_digest)
    if found is None:
        reason = (
            f"no code {short(hex_digest)}… in this workspace: upload it first (astra astraeus "
            "submit --workdir FOLDER does both)"
        )
        raise InvalidInput("CODE_NOT_FOUND", [FieldError("code", reason)])
    await repository.touch(session, found.id, clock.now())
    return found


async def archives_by_id(session: AsyncSession, ids: Sequence[int]) -> dict[int, CodeArchive]:
    return await repository.archives(session, ids)


async def for_machine(
    session: AsyncSession, machine_id: int, worker_id: int, attempt: int, digest: str
) -> CodeArchive | None:
    """The archive a machine may fetch: its worker's run's, at the attempt it prepares."""
    hex_digest = hex_of(digest)
    if hex_digest is None:
        return None
    return await repository.placed_archive(session, machine_id, worker_id, attempt, hex_digest)


async def chunk(session: AsyncSession, archive_id: int, seq: int) -> bytes | None:
    return await repository.chunk(session, archive_id, seq)


async def prune(session: AsyncSession, clock: Clock, retention: timedelta = RETENTION) -> int:
    return await repository.prune(session, clock.now() - retention)


async def unpack_into(db: Database, archive_id: int, into: Path) -> str | None:
    """A stored archive read back a chunk at a time, checked against its digest and unpacked
    into ``into`` (a Slurm run's folder, which its nodes read); why it cannot be, or None."""
    async with db.read() as session:
        found = await repository.archives(session, [archive_id])
    row = found.get(archive_id)
    if row is None:
        return "its code is no longer stored: submit it again with --workdir"
    with tempfile.SpooledTemporaryFile(SPOOL_IN_MEMORY) as body:
        for seq in range(row.chunks):
            async with db.read() as session:
                piece = await repository.chunk(session, archive_id, seq)
            if piece is None:
                return "its code is no longer stored: submit it again with --workdir"
            body.write(piece)
        if await asyncio.to_thread(sha256_of, body) != row.digest:
            return f"its code {short(row.digest)}… read back with another SHA-256"
        try:
            await asyncio.to_thread(unpack, body, into)
        except ArchiveRefused as refused:
            return f"its code {short(row.digest)}… {refused}"
    return None


def sha256_of(body: IO[bytes]) -> str:
    body.seek(0)
    digest = hashlib.sha256()
    while piece := body.read(CHUNK_BYTES):
        digest.update(piece)
    return digest.hexdigest()
