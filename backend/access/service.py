"""The access domain's entry point: authenticate a bearer token, create users and tokens."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access import repository
from backend.access.rules import (
    TOKEN_PREFIX,
    AgentPrincipal,
    Principal,
    hash_token,
    looks_like_token,
)
from backend.clock import Clock
from backend.errors import Unauthenticated
from backend.models import ApiToken, Membership, User


@dataclass(frozen=True)
class IssuedToken:
    secret: str
    token_id: int


async def authenticate(session: AsyncSession, secret: str | None) -> Principal:
    """The principal behind ``Authorization: Bearer <secret>``; refuses anything else."""
    if not secret:
        raise Unauthenticated("An API token is required: send 'Authorization: Bearer <token>'.")
    if not looks_like_token(secret):
        raise Unauthenticated("The API token is malformed.")
    holder = await repository.find_user_token(session, hash_token(secret))
    if holder is None:
        raise Unauthenticated("The API token is unknown or revoked.")
    return Principal(
        token_id=holder.token_id,
        user_id=holder.user_id,
        user_name=holder.user_name,
        organization_id=holder.organization_id,
        organization_name=holder.organization_name,
        workspace_id=holder.workspace_id,
        workspace_name=holder.workspace_name,
        is_org_admin=holder.is_org_admin,
    )


async def authenticate_agent(session: AsyncSession, secret: str | None) -> AgentPrincipal:
    """The cluster a machine's agent may join, from its machine token."""
    if not secret or not looks_like_token(secret):
        raise Unauthenticated("A machine token is required.")
    token = await repository.find_agent_token(session, hash_token(secret))
    if token is None or token.cluster_id is None:
        raise Unauthenticated("The machine token is unknown or revoked.")
    return AgentPrincipal(
        token_id=token.id, organization_id=token.organization_id, cluster_id=token.cluster_id
    )


async def issue_agent_token(
    session: AsyncSession, clock: Clock, *, organization_id: int, cluster_id: int, name: str = ""
) -> IssuedToken:
    """A token for the agents of one cluster's machines. Shown once, stored as its digest."""
    return await _issue(
        session,
        clock,
        name=name,
        kind="agent",
        organization_id=organization_id,
        cluster_id=cluster_id,
    )


async def ensure_user(
    session: AsyncSession,
    clock: Clock,
    *,
    name: str,
    organization_id: int,
    workspace_id: int | None,
    org_admin: bool,
) -> User:
    """The user called ``name``, created if new, with the membership asked for."""
    user = await repository.get_user_by_name(session, name)
    if user is None:
        user = User(name=name, created_at=clock.now())
        repository.add(session, user)
        await session.flush()
    member_of = None if org_admin else workspace_id
    if await repository.find_membership(session, user.id, organization_id, member_of) is None:
        repository.add(
            session,
            Membership(
                user_id=user.id,
                organization_id=organization_id,
                workspace_id=member_of,
                role="org_admin" if org_admin else "member",
                created_at=clock.now(),
            ),
        )
        await session.flush()
    return user


async def issue_user_token(
    session: AsyncSession,
    clock: Clock,
    *,
    user: User,
    organization_id: int,
    workspace_id: int,
    name: str = "",
) -> IssuedToken:
    """A new token for ``user`` acting in a workspace. The secret is returned once, never stored."""
    return await _issue(
        session,
        clock,
        name=name,
        kind="user",
        user_id=user.id,
        organization_id=organization_id,
        workspace_id=workspace_id,
    )


async def _issue(session: AsyncSession, clock: Clock, **fields: Any) -> IssuedToken:
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(
        token_hash=hash_token(secret), prefix=secret[:12], created_at=clock.now(), **fields
    )
    repository.add(session, token)
    await session.flush()
    return IssuedToken(secret=secret, token_id=token.id)
