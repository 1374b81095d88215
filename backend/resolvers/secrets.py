"""Resolvers of secrets: set, declared external, listed (names only), deleted."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from backend.request.context import Info
from backend.resolvers.mutations import mutate
from backend.schema.common import UserError
from backend.schema.secrets import Secret, SecretPayload
from backend.secrets import service as secrets


async def list_secrets(info: Info, workspace: str | None = None) -> list[Secret]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        rows = await secrets.list_secrets(session, principal, workspace=workspace)
    return [Secret.from_model(r) for r in rows]


async def set_secret(
    info: Info, name: str, value: str | None = None, workspace: str | None = None
) -> SecretPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> Secret:
        row = await secrets.set_secret(
            session, info.context.clock, principal, name, value, workspace=workspace
        )
        return Secret.from_model(row)

    return await mutate(info, work, _done, _refused)


async def delete_secret(info: Info, name: str, workspace: str | None = None) -> SecretPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> Secret:
        row = await secrets.delete_secret(session, principal, name, workspace=workspace)
        return Secret.from_model(row)

    return await mutate(info, work, _done, _refused)


def _done(secret: Secret) -> SecretPayload:
    return SecretPayload(secret=secret, errors=[])


def _refused(errors: list[UserError]) -> SecretPayload:
    return SecretPayload(secret=None, errors=errors)
