"""All SQL of machine identity."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import JoinToken, MachineCredential


async def join_token_by_hash(session: AsyncSession, token_hash: str) -> JoinToken | None:
    return await session.scalar(
        select(JoinToken).where(JoinToken.token_hash == token_hash).with_for_update()
    )


async def credential_by_hash(session: AsyncSession, token_hash: str) -> MachineCredential | None:
    return await session.scalar(
        select(MachineCredential).where(MachineCredential.token_hash == token_hash)
    )


async def live_credentials(
    session: AsyncSession, cluster_id: int, machine: str
) -> list[MachineCredential]:
    return list(
        await session.scalars(
            select(MachineCredential).where(
                MachineCredential.cluster_id == cluster_id,
                MachineCredential.machine == machine,
                MachineCredential.revoked_at.is_(None),
            )
        )
    )


async def credential_is_live(session: AsyncSession, credential_id: int) -> bool:
    found = await session.scalar(
        select(MachineCredential.id).where(
            MachineCredential.id == credential_id, MachineCredential.revoked_at.is_(None)
        )
    )
    return found is not None


async def legacy_token_is_live(session: AsyncSession, token_id: int) -> bool:
    found = await session.scalar(
        select(JoinToken.id).where(JoinToken.id == token_id, JoinToken.revoked_at.is_(None))
    )
    return found is not None


# At most this many ids in one IN (...): SQLite's bound parameters are limited.
IDS_PER_QUERY = 500


async def live_credential_ids(session: AsyncSession, ids: Collection[int]) -> set[int]:
    """Which of these credentials are not revoked (one query per IDS_PER_QUERY)."""
    return await _not_revoked(session, MachineCredential, ids)


async def live_join_token_ids(session: AsyncSession, ids: Collection[int]) -> set[int]:
    """Which of these join tokens are not revoked."""
    return await _not_revoked(session, JoinToken, ids)


async def _not_revoked(
    session: AsyncSession, model: type[MachineCredential] | type[JoinToken], ids: Collection[int]
) -> set[int]:
    wanted = sorted(ids)
    live: set[int] = set()
    for i in range(0, len(wanted), IDS_PER_QUERY):
        chunk = wanted[i : i + IDS_PER_QUERY]
        live.update(
            await session.scalars(
                select(model.id).where(model.id.in_(chunk), model.revoked_at.is_(None))
            )
        )
    return live


async def join_tokens(session: AsyncSession, cluster_id: int) -> list[JoinToken]:
    return list(
        await session.scalars(
            select(JoinToken).where(JoinToken.cluster_id == cluster_id).order_by(JoinToken.id)
        )
    )


async def credentials(session: AsyncSession, cluster_id: int) -> list[MachineCredential]:
    return list(
        await session.scalars(
            select(MachineCredential)
            .where(MachineCredential.cluster_id == cluster_id)
            .order_by(MachineCredential.machine, MachineCredential.id)
        )
    )


async def join_token(session: AsyncSession, cluster_id: int, token_id: int) -> JoinToken | None:
    return await session.scalar(
        select(JoinToken).where(JoinToken.id == token_id, JoinToken.cluster_id == cluster_id)
    )


async def legacy_token_by_hash(session: AsyncSession, token_hash: str) -> JoinToken | None:
    return await session.scalar(
        select(JoinToken).where(
            JoinToken.token_hash == token_hash,
            JoinToken.legacy.is_(True),
            JoinToken.revoked_at.is_(None),
        )
    )


async def mark_credential_used(session: AsyncSession, credential_id: int, at: datetime) -> None:
    await session.execute(
        update(MachineCredential)
        .where(MachineCredential.id == credential_id)
        .values(last_used_at=at)
    )


async def mark_join_token_used(session: AsyncSession, token_id: int, at: datetime) -> None:
    await session.execute(update(JoinToken).where(JoinToken.id == token_id).values(last_used_at=at))


def add(session: AsyncSession, *rows: object) -> None:
    session.add_all(rows)
