"""The access domain's entry point: authenticate a bearer token, create users and tokens."""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access import repository
from backend.access.repository import TokenRow
from backend.access.rules import (
    TOKEN_PREFIX,
    Principal,
    hash_token,
    looks_like_token,
    token_reference,
    token_refusal,
)
from backend.clock import Clock
from backend.db import Database
from backend.db.retries import database_away
from backend.errors import Conflict, NotFound, Unauthenticated
from backend.models import ApiToken, Membership, User

log = logging.getLogger(__name__)


# How often a replica writes when its tokens were last used: in memory per request, in the
# database once a minute for all of them (a write per request would cost every read a
# transaction of its own; on SQLite, a wait for the one write lock).
USES_WRITTEN_EVERY_S = 60.0


class TokenUses:
    """When this replica's requests last used each token, written every USES_WRITTEN_EVERY_S
    in one transaction: `astraeus token list` shows it as LAST USED, so an admin tells a token
    in use from one to revoke. A write that fails (the database busy or away) keeps what it
    held for the next."""

    def __init__(self) -> None:
        self.pending: dict[int, datetime] = {}

    def note(self, principal: Principal, now: datetime) -> None:
        """The principal's token was used at ``now`` (its request was authenticated)."""
        last = self.pending.get(principal.token_id)
        if last is None or now > last:
            self.pending[principal.token_id] = now

    async def write(self, db: Database) -> None:
        """Write what was noted since the last write."""
        uses, self.pending = self.pending, {}
        if not uses:
            return
        try:
            async with db.transaction() as session:
                for token_id, at in sorted(uses.items()):
                    await repository.mark_used(session, token_id, at)
        except Exception as error:
            for token_id, at in uses.items():  # kept for the next write, the later time kept
                if token_id not in self.pending or at > self.pending[token_id]:
                    self.pending[token_id] = at
            if not database_away(error):
                log.warning("when %d tokens were last used was not written: %s", len(uses), error)

    async def keep(self, db: Database, every_s: float = USES_WRITTEN_EVERY_S) -> None:
        """Write every ``every_s`` until cancelled (the server stopping writes once more)."""
        while True:
            await asyncio.sleep(every_s)
            await self.write(db)


@dataclass(frozen=True)
class IssuedToken:
    secret: str
    token_id: int


async def authenticate(
    session: AsyncSession, secret: str | None, now: datetime | None = None
) -> Principal:
    """The principal behind ``Authorization: Bearer <secret>`` at ``now`` (default: the system
    clock's); refuses anything else, and a revoked or expired token."""
    if not secret:
        raise Unauthenticated("An API token is required: send 'Authorization: Bearer <token>'.")
    if not looks_like_token(secret):
        raise Unauthenticated("The API token is malformed.")
    holder = await repository.find_user_token(session, hash_token(secret))
    if holder is None:
        raise Unauthenticated("The API token is unknown or revoked.")
    refusal = token_refusal(holder.revoked_at, holder.expires_at, now or datetime.now(UTC))
    if refusal is not None:
        raise Unauthenticated(refusal)
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
    expires_in: timedelta | None = None,
) -> IssuedToken:
    """A new token for ``user`` acting in a workspace, refused ``expires_in`` from now (None:
    never expires). The secret is returned once, never stored."""
    return await _issue(
        session,
        clock,
        name=name,
        kind="user",
        user_id=user.id,
        organization_id=organization_id,
        workspace_id=workspace_id,
        expires_at=None if expires_in is None else clock.now() + expires_in,
    )


async def list_tokens(session: AsyncSession, principal: Principal) -> list[TokenRow]:
    """The user tokens ``principal`` may see: its user's own; an organisation admin's: every
    user token of the organisation's workspaces."""
    organization_id, user_id = _visible(principal)
    return await repository.user_tokens(session, organization_id=organization_id, user_id=user_id)


async def revoke_token(
    session: AsyncSession, clock: Clock, principal: Principal, reference: str
) -> TokenRow:
    """Revoke a token ``principal`` may see, by id or prefix; another's is as if absent."""
    organization_id, user_id = _visible(principal)
    return await _revoke(session, clock, reference, organization_id, user_id)


async def organization_tokens(session: AsyncSession, organization_id: int) -> list[TokenRow]:
    """Every user token of an organisation (``astraeus token list``)."""
    return await repository.user_tokens(session, organization_id=organization_id)


async def revoke_organization_token(
    session: AsyncSession, clock: Clock, organization_id: int, reference: str
) -> TokenRow:
    """``astraeus token revoke``: a user token of the organisation, by id or prefix."""
    return await _revoke(session, clock, reference, organization_id, None)


def _visible(principal: Principal) -> tuple[int, int | None]:
    """(organisation, user) of the tokens ``principal`` sees; user None: every user's."""
    if principal.is_org_admin:
        return principal.organization_id, None
    # A user token always has its user; -1 (no one) should one ever lack it.
    return principal.organization_id, principal.user_id if principal.user_id is not None else -1


async def _revoke(
    session: AsyncSession,
    clock: Clock,
    reference: str,
    organization_id: int,
    user_id: int | None,
) -> TokenRow:
    token_id, prefix = token_reference(reference)
    if token_id is None and not prefix:
        raise NotFound("TOKEN_NOT_FOUND", "Name a token by its id or its first characters.")
    found = await repository.user_tokens(
        session,
        organization_id=organization_id,
        user_id=user_id,
        token_id=token_id,
        prefix=prefix,
    )
    if not found:
        raise NotFound("TOKEN_NOT_FOUND", f"No token '{reference}'.")
    if len(found) > 1:
        raise Conflict(
            "TOKEN_AMBIGUOUS",
            f"'{reference}' begins {len(found)} tokens; give more characters or the id.",
        )
    await repository.revoke_token(session, found[0].id, clock.now())
    rows = await repository.user_tokens(session, token_id=found[0].id)
    return rows[0]


async def _issue(session: AsyncSession, clock: Clock, **fields: Any) -> IssuedToken:
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(
        token_hash=hash_token(secret), prefix=secret[:12], created_at=clock.now(), **fields
    )
    repository.add(session, token)
    await session.flush()
    return IssuedToken(secret=secret, token_id=token.id)
