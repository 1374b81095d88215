"""All SQL of the access domain."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import ApiToken, Membership, Organization, User, Workspace


@dataclass(frozen=True)
class TokenHolder:
    """A live user token with everything a principal needs, read in one statement."""

    token_id: int
    user_id: int
    user_name: str
    organization_id: int
    organization_name: str
    workspace_id: int | None
    workspace_name: str | None
    is_org_admin: bool
    revoked_at: datetime | None
    expires_at: datetime | None


async def find_user_token(session: AsyncSession, token_hash: str) -> TokenHolder | None:
    admin = (
        select(Membership.id)
        .where(
            Membership.user_id == ApiToken.user_id,
            Membership.organization_id == ApiToken.organization_id,
            Membership.role == "org_admin",
        )
        .exists()
    )
    row = (
        await session.execute(
            select(
                ApiToken.id,
                User.id.label("user_id"),
                User.name.label("user_name"),
                Organization.id.label("organization_id"),
                Organization.name.label("organization_name"),
                Workspace.id.label("workspace_id"),
                Workspace.name.label("workspace_name"),
                admin.label("is_org_admin"),
                ApiToken.revoked_at,
                ApiToken.expires_at,
            )
            .join(User, User.id == ApiToken.user_id)
            .join(Organization, Organization.id == ApiToken.organization_id)
            .outerjoin(Workspace, Workspace.id == ApiToken.workspace_id)
            .where(
                ApiToken.token_hash == token_hash,
                ApiToken.kind == "user",
            )
        )
    ).one_or_none()
    if row is None:
        return None
    return TokenHolder(
        token_id=row.id,
        user_id=row.user_id,
        user_name=row.user_name,
        organization_id=row.organization_id,
        organization_name=row.organization_name,
        workspace_id=row.workspace_id,
        workspace_name=row.workspace_name,
        is_org_admin=bool(row.is_org_admin),
        revoked_at=row.revoked_at,
        expires_at=row.expires_at,
    )


async def get_user_by_name(session: AsyncSession, name: str) -> User | None:
    return await session.scalar(select(User).where(User.name == name))


async def find_membership(
    session: AsyncSession, user_id: int, organization_id: int, workspace_id: int | None
) -> Membership | None:
    query = select(Membership).where(
        Membership.user_id == user_id, Membership.organization_id == organization_id
    )
    if workspace_id is None:
        query = query.where(Membership.workspace_id.is_(None))
    else:
        query = query.where(Membership.workspace_id == workspace_id)
    return await session.scalar(query)


@dataclass(frozen=True)
class TokenRow:
    """A user token as listings show it (never its secret or digest)."""

    id: int
    prefix: str
    name: str
    user_name: str
    workspace_name: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


async def user_tokens(
    session: AsyncSession,
    *,
    organization_id: int | None = None,
    user_id: int | None = None,
    token_id: int | None = None,
    prefix: str | None = None,
) -> list[TokenRow]:
    """User tokens, narrowed by whichever of organisation, user, id and prefix are given."""
    query = (
        select(
            ApiToken.id,
            ApiToken.prefix,
            ApiToken.name,
            User.name.label("user_name"),
            Workspace.name.label("workspace_name"),
            ApiToken.created_at,
            ApiToken.expires_at,
            ApiToken.revoked_at,
            ApiToken.last_used_at,
        )
        .join(User, User.id == ApiToken.user_id)
        .outerjoin(Workspace, Workspace.id == ApiToken.workspace_id)
        .where(ApiToken.kind == "user")
        .order_by(ApiToken.id)
    )
    if organization_id is not None:
        query = query.where(ApiToken.organization_id == organization_id)
    if user_id is not None:
        query = query.where(ApiToken.user_id == user_id)
    if token_id is not None:
        query = query.where(ApiToken.id == token_id)
    if prefix is not None:
        query = query.where(ApiToken.prefix.startswith(prefix, autoescape=True))
    return [TokenRow(**row._mapping) for row in await session.execute(query)]


async def revoke_token(session: AsyncSession, token_id: int, now: datetime) -> None:
    await session.execute(
        update(ApiToken)
        .where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
        .values(revoked_at=now)
    )


async def mark_used(session: AsyncSession, token_id: int, at: datetime) -> None:
    """The token was used at ``at`` (never moved back by a slower request)."""
    await session.execute(
        update(ApiToken)
        .where(
            ApiToken.id == token_id,
            (ApiToken.last_used_at.is_(None)) | (ApiToken.last_used_at < at),
        )
        .values(last_used_at=at)
    )


async def token_states(
    session: AsyncSession, token_ids: Collection[int]
) -> dict[int, tuple[datetime | None, datetime | None]]:
    """Each of ``token_ids`` that still exists: (revoked_at, expires_at)."""
    rows = await session.execute(
        select(ApiToken.id, ApiToken.revoked_at, ApiToken.expires_at).where(
            ApiToken.id.in_(token_ids)
        )
    )
    return {row.id: (row.revoked_at, row.expires_at) for row in rows}


def add(session: AsyncSession, *rows: object) -> None:
    session.add_all(rows)
