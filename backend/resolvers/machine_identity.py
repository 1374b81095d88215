"""Resolvers of machine identity: organisation admins make and revoke join tokens, list and
revoke machines' credentials."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from backend.config import parse_duration
from backend.errors import FieldError, InvalidInput
from backend.machine_identity import service as identity
from backend.request.context import Info
from backend.resolvers.mutations import mutate
from backend.schema.common import UserError
from backend.schema.machine_identity import (
    JoinToken,
    JoinTokenPayload,
    MachineCredential,
    MachineCredentialPayload,
)


async def join_tokens(info: Info, cluster: str = "local") -> list[JoinToken]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await identity.admin_cluster(session, principal, cluster)
        return [JoinToken.from_model(t) for t in await identity.list_join_tokens(session, found)]


async def machine_credentials(info: Info, cluster: str = "local") -> list[MachineCredential]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await identity.admin_cluster(session, principal, cluster)
        rows = await identity.list_credentials(session, found)
        return [MachineCredential.from_model(c) for c in rows]


async def create_join_token(
    info: Info, cluster: str = "local", expires: str = "24h", uses: int = 1, name: str = ""
) -> JoinTokenPayload:
    principal = info.context.require_principal()
    try:
        expires_in = parse_duration(expires)
    except ValueError as error:
        refusal = InvalidInput("INVALID_JOIN_TOKEN", [FieldError("expires", str(error))])
        return _no_join_token(UserError.from_error(refusal))

    async def work(session: AsyncSession) -> tuple[JoinToken, str]:
        found = await identity.admin_cluster(session, principal, cluster)
        issued = await identity.issue_join_token(
            session,
            info.context.clock,
            organization_id=found.organization_id,
            cluster_id=found.id,
            expires_in=expires_in,
            uses=uses,
            name=name,
        )
        rows = await identity.list_join_tokens(session, found)
        made = next(JoinToken.from_model(t) for t in rows if t.id == issued.token_id)
        return made, issued.secret

    return await mutate(
        info,
        work,
        lambda made: JoinTokenPayload(join_token=made[0], secret=made[1], errors=[]),
        _no_join_token,
    )


async def revoke_join_token(info: Info, id: int, cluster: str = "local") -> JoinTokenPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> JoinToken:
        found = await identity.admin_cluster(session, principal, cluster)
        row = await identity.revoke_join_token(session, info.context.clock, found, id)
        return JoinToken.from_model(row)

    return await mutate(
        info,
        work,
        lambda token: JoinTokenPayload(join_token=token, secret=None, errors=[]),
        _no_join_token,
    )


async def revoke_machine_credential(
    info: Info, machine: str, cluster: str = "local"
) -> MachineCredentialPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> list[MachineCredential]:
        found = await identity.admin_cluster(session, principal, cluster)
        rows, _ = await identity.revoke_credential(session, info.context.clock, found, machine)
        return [MachineCredential.from_model(c) for c in rows]

    return await mutate(
        info,
        work,
        lambda revoked: MachineCredentialPayload(credentials=revoked, errors=[]),
        lambda errors: MachineCredentialPayload(credentials=[], errors=errors),
    )


def _no_join_token(errors: list[UserError]) -> JoinTokenPayload:
    return JoinTokenPayload(join_token=None, secret=None, errors=errors)
