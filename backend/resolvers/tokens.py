"""Resolvers of user API tokens: listed, revoked."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access import service as access
from backend.errors import AstraeusError
from backend.resolvers.context import Info
from backend.schema.common import UserError
from backend.schema.tokens import ApiToken, ApiTokenPayload


async def list_tokens(info: Info) -> list[ApiToken]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        rows = await access.list_tokens(session, principal)
    return [ApiToken.of(r) for r in rows]


async def revoke_token(info: Info, token: str) -> ApiTokenPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> ApiToken:
        row = await access.revoke_token(session, info.context.clock, principal, token)
        return ApiToken.of(row)

    try:  # tried again whole if it lost to another transaction (issue 19)
        return ApiTokenPayload(token=await info.context.db.unit(work), errors=[])
    except AstraeusError as error:
        return ApiTokenPayload(token=None, errors=UserError.from_error(error))
