"""All SQL of the access domain."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from backend.models import ApiToken, Membership, Organization, User, Workspace


async def find_token(session: AsyncSession, token_hash: str) -> ApiToken | None:
    return await session.scalar(
        select(ApiToken).where(ApiToken.token_hash == token_hash, ApiToken.revoked_at.is_(None))
    )


async def get_user(session: AsyncSession, user_id: int) -> User | None:
    return await session.get(User, user_id)


async def get_user_by_name(session: AsyncSession, name: str) -> User | None:
    return await session.scalar(select(User).where(User.name == name))


async def is_org_admin(session: AsyncSession, user_id: int, organization_id: int) -> bool:
    found = await session.scalar(
        select(Membership.id).where(
            Membership.user_id == user_id,
            Membership.organization_id == organization_id,
            Membership.role == "org_admin",
        )
    )
    return found is not None


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


async def get_names(
    session: AsyncSession, organization_id: int, workspace_id: int | None
) -> tuple[str, str | None]:
    org_name = await session.scalar(
        select(Organization.name).where(Organization.id == organization_id)
    )
    ws_name = None
    if workspace_id is not None:
        ws_name = await session.scalar(select(Workspace.name).where(Workspace.id == workspace_id))
    return str(org_name), ws_name


async def touch_token(session: AsyncSession, token_id: int, at: datetime) -> None:
    await session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=at))


def add(session: AsyncSession, *rows: object) -> None:
    session.add_all(rows)
