"""Machine identity's entry point: join tokens an organisation admin makes, exchanged once by a
machine's agent for a credential bound to that machine's name in its cluster; the credential
authenticates its stream, and an admin lists and revokes credentials (the machine is then lost
at once, its workers placed elsewhere, its open stream closed).

Cluster machine tokens made before machines had credentials are legacy join tokens: they join
like any join token, and connect directly as a machine that holds no credential of its own,
until an admin revokes them.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.clock import Clock
from backend.db.commit_jobs import after_commit
from backend.db.commit_signals import rows_changed
from backend.errors import FieldError, Forbidden, InvalidInput, NotFound, Unauthenticated
from backend.job_names import PASS_JOB
from backend.lifecycle.views import Effects
from backend.machine_identity import repository
from backend.machine_identity.rules import (
    CREDENTIAL_PREFIX,
    DEFAULT_EXPIRY,
    JOIN_ONLY,
    JOIN_PREFIX,
    REVOKED,
    UNKNOWN,
    IssuedState,
    JoinTokenState,
    MachinePrincipal,
    already_joined,
    expiry_problem,
    hash_token,
    is_join_retry,
    is_join_token,
    join_refusal,
    uses_problem,
    well_formed,
)
from backend.machines import rules as machine_rules
from backend.machines import service as machines
from backend.models import Cluster, JoinToken, MachineCredential
from backend.organizations import service as organizations


@dataclass(frozen=True)
class Issued:
    """A new token's secret (shown once, stored as its digest) and its id."""

    secret: str
    token_id: int


class JoinRefused(Exception):
    """A join the server refuses: ``unauthenticated`` for the token, else for the machine."""

    def __init__(self, message: str, *, unauthenticated: bool) -> None:
        super().__init__(message)
        self.message, self.unauthenticated = message, unauthenticated


def _new_secret(prefix: str) -> tuple[str, str, str]:
    secret = prefix + secrets.token_urlsafe(32)
    return secret, hash_token(secret), secret[:12]


async def issue_join_token(
    session: AsyncSession,
    clock: Clock,
    *,
    organization_id: int,
    cluster_id: int,
    expires_in: timedelta = DEFAULT_EXPIRY,
    uses: int = 1,
    name: str = "",
) -> Issued:
    """A token for machines to join one cluster: ``uses`` machines, until ``expires_in``."""
    problems = [
        FieldError(field, problem)
        for field, problem in (
            ("expires", expiry_problem(expires_in)),
            ("uses", uses_problem(uses)),
        )
        if problem
    ]
    if problems:
        raise InvalidInput("INVALID_JOIN_TOKEN", problems)
    secret, digest, prefix = _new_secret(JOIN_PREFIX)
    now = clock.now()
    token = JoinToken(
        token_hash=digest,
        prefix=prefix,
        name=name,
        organization_id=organization_id,
        cluster_id=cluster_id,
        expires_at=now + expires_in,
        uses_left=uses,
        legacy=False,
        created_at=now,
    )
    repository.add(session, token)
    await session.flush()
    return Issued(secret, token.id)


async def join(session: AsyncSession, clock: Clock, secret: str, machine: str) -> Issued:
    """Exchange a join token for ``machine``'s own credential, once per machine: a machine that
    already holds a live credential cannot be joined again (nor posed as) until it is revoked."""
    now = clock.now()
    token = (
        await repository.join_token_by_hash(session, hash_token(secret))
        if well_formed(secret)
        else None
    )
    state = (
        JoinTokenState(token.expires_at, token.uses_left, token.revoked_at is not None)
        if token
        else None
    )
    live = await repository.live_credentials(session, token.cluster_id, machine) if token else []
    retry = token is not None and is_join_retry(
        [IssuedState(c.join_token_id, c.created_at, c.last_used_at) for c in live],
        token.id,
        now,
    )
    if retry and state is not None:  # its use was counted by the join it retries
        state = JoinTokenState(state.expires_at, None, state.revoked)
    refusal = join_refusal(state, now)
    if refusal or token is None:
        raise JoinRefused(refusal or UNKNOWN, unauthenticated=True)
    problem = machine_rules.name_problem("machine", machine)
    if problem:
        raise JoinRefused(f"The machine's name is refused: {problem}.", unauthenticated=False)
    if live and not retry:
        raise JoinRefused(already_joined(machine), unauthenticated=False)
    for lost in live:  # the credential whose answer never reached the agent: never usable
        lost.revoked_at = now
    if token.uses_left is not None and not retry:
        token.uses_left -= 1
    token.last_used_at = now
    credential, digest, prefix = _new_secret(CREDENTIAL_PREFIX)
    row = MachineCredential(
        token_hash=digest,
        prefix=prefix,
        organization_id=token.organization_id,
        cluster_id=token.cluster_id,
        machine=machine,
        join_token_id=token.id,
        created_at=now,
    )
    repository.add(session, row)
    await session.flush()
    return Issued(credential, row.id)


async def authenticate(session: AsyncSession, secret: str | None) -> MachinePrincipal:
    """The machine (or, for a legacy cluster token, the cluster) a stream's token speaks for."""
    if not secret or not well_formed(secret):
        raise Unauthenticated("A machine credential is required.")
    if is_join_token(secret):
        raise Unauthenticated(JOIN_ONLY)
    digest = hash_token(secret)
    credential = await repository.credential_by_hash(session, digest)
    if credential is not None and credential.revoked_at is not None:
        raise Unauthenticated(REVOKED)
    if credential is not None:
        return MachinePrincipal(
            organization_id=credential.organization_id,
            cluster_id=credential.cluster_id,
            machine=credential.machine,
            credential_id=credential.id,
        )
    legacy = await repository.legacy_token_by_hash(session, digest)
    if legacy is None:
        raise Unauthenticated(UNKNOWN)
    return MachinePrincipal(
        organization_id=legacy.organization_id,
        cluster_id=legacy.cluster_id,
        machine=None,
        join_token_id=legacy.id,
    )


async def registration_refusal(
    session: AsyncSession, principal: MachinePrincipal, machine: str
) -> str | None:
    """Why this principal may not register as ``machine``, or None (checked at each Hello)."""
    held = bool(await repository.live_credentials(session, principal.cluster_id, machine))
    return principal.registration_refusal(machine, held)


async def still_valid(session: AsyncSession, principal: MachinePrincipal) -> str | None:
    """Why a stream opened with this principal must close now (its token was revoked), or None."""
    if principal.credential_id is not None:
        live = await repository.credential_is_live(session, principal.credential_id)
        return None if live else REVOKED
    assert principal.join_token_id is not None
    live = await repository.legacy_token_is_live(session, principal.join_token_id)
    return None if live else UNKNOWN


async def revoked_among(
    session: AsyncSession, principals: Iterable[MachinePrincipal]
) -> dict[MachinePrincipal, str]:
    """The principals among these whose streams must close now, each with why: what
    still_valid says of each, for all of a replica's streams in one query or two."""
    principals = set(principals)
    credentials = {p.credential_id for p in principals if p.credential_id is not None}
    tokens = {p.join_token_id for p in principals if p.credential_id is None and p.join_token_id}
    live_credentials = await repository.live_credential_ids(session, credentials)
    live_tokens = await repository.live_join_token_ids(session, tokens)
    refused: dict[MachinePrincipal, str] = {}
    for p in principals:
        if p.credential_id is not None:
            if p.credential_id not in live_credentials:
                refused[p] = REVOKED
        elif p.join_token_id not in live_tokens:
            refused[p] = UNKNOWN
    return refused


async def mark_used(session: AsyncSession, clock: Clock, principal: MachinePrincipal) -> None:
    if principal.credential_id is not None:
        await repository.mark_credential_used(session, principal.credential_id, clock.now())
    elif principal.join_token_id is not None:
        await repository.mark_join_token_used(session, principal.join_token_id, clock.now())


# -- what an organisation admin does ------------------------------------------------------------


async def admin_cluster(session: AsyncSession, principal: Principal, cluster: str) -> Cluster:
    """One of the admin's clusters; anyone else is told it does not exist."""
    if not principal.is_org_admin:
        raise Forbidden("Only an organisation admin manages machines' tokens and credentials.")
    return await organizations.cluster_by_name(session, principal.organization_id, cluster)


async def list_join_tokens(session: AsyncSession, cluster: Cluster) -> list[JoinToken]:
    return await repository.join_tokens(session, cluster.id)


async def list_credentials(session: AsyncSession, cluster: Cluster) -> list[MachineCredential]:
    return await repository.credentials(session, cluster.id)


async def revoke_join_token(
    session: AsyncSession, clock: Clock, cluster: Cluster, token_id: int
) -> JoinToken:
    """No machine joins with it any more (and a legacy token's streams are closed); the
    credentials made from it stay valid."""
    token = await repository.join_token(session, cluster.id, token_id)
    if token is None:
        raise NotFound(
            "JOIN_TOKEN_NOT_FOUND", f"No join token {token_id} in cluster '{cluster.name}'."
        )
    if token.revoked_at is None:
        token.revoked_at = clock.now()
        rows_changed(session, JoinToken.__tablename__)  # its streams close: every replica's
    await session.flush()
    return token


async def revoke_credential(
    session: AsyncSession, clock: Clock, cluster: Cluster, machine: str
) -> tuple[list[MachineCredential], Effects]:
    """Revoke the machine's credential: it is lost at once (its workers are placed elsewhere,
    as for a lost lease), and its open stream is closed (backend/gateway/delivery.py)."""
    live = await repository.live_credentials(session, cluster.id, machine)
    if not live:
        raise NotFound(
            "CREDENTIAL_NOT_FOUND",
            f"Machine '{machine}' of cluster '{cluster.name}' holds no credential.",
        )
    now = clock.now()
    for credential in live:
        credential.revoked_at = now
    rows_changed(session, MachineCredential.__tablename__)  # its stream closes, on any replica
    await session.flush()
    fx = await machines.lose(session, clock, cluster.id, machine, "Machine lost: " + REVOKED)
    after_commit(session, PASS_JOB)  # its workers wait to be placed again elsewhere
    return live, fx


async def rejoin_token(
    session: AsyncSession, clock: Clock, cluster: Cluster, machine: str, old_secret: str | None
) -> Issued:
    """`astraeus up`'s own machine, whose agent holds no credential (a new data folder, or one
    from before credentials): a join token for it alone, for an hour. The machine token `up`
    made before credentials (``old_secret``) is rotated, and a credential the machine lost
    with its agent's folder is revoked."""
    if old_secret and well_formed(old_secret):
        legacy = await repository.legacy_token_by_hash(session, hash_token(old_secret))
        if legacy is not None:
            legacy.revoked_at = clock.now()
            rows_changed(session, JoinToken.__tablename__)
    if await repository.live_credentials(session, cluster.id, machine):
        await revoke_credential(session, clock, cluster, machine)
    return await issue_join_token(
        session,
        clock,
        organization_id=cluster.organization_id,
        cluster_id=cluster.id,
        expires_in=timedelta(hours=1),
        uses=1,
        name=machine,
    )
