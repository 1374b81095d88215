"""All SQL of the access domain."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
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
            )
            .join(User, User.id == ApiToken.user_id)
            .join(Organization, Organization.id == ApiToken.organization_id)
            .outerjoin(Workspace, Workspace.id == ApiToken.workspace_id)
            .where(
                ApiToken.token_hash == token_hash,
                ApiToken.revoked_at.is_(None),
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
    )


async def find_agent_token(session: AsyncSession, token_hash: str) -> ApiToken | None:
    return await session.scalar(
        select(ApiToken).where(
            ApiToken.token_hash == token_hash,
            ApiToken.revoked_at.is_(None),
            ApiToken.kind == "agent",
            ApiToken.cluster_id.is_not(None),
        )
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


def add(session: AsyncSession, *rows: object) -> None:
    session.add_all(rows)
