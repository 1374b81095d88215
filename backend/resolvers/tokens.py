"""Resolvers of user API tokens: listed, revoked."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from backend import ids
from backend.access import service as access
from backend.errors import NotFound
from backend.request.context import Info
from backend.resolvers.mutations import mutate
from backend.schema.tokens import ApiToken, ApiTokenPayload


async def list_tokens(info: Info) -> list[ApiToken]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        rows = await access.list_tokens(session, principal)
    codec = await ids.codec(info.context.db)
    return [ApiToken.of(r, codec) for r in rows]


async def revoke_token(info: Info, token: str) -> ApiTokenPayload:
    principal = info.context.require_principal()
    codec = await ids.codec(info.context.db)
    number = codec.open(ids.Kind.TOKEN, token.strip())
    # its id as listings show it, else its first characters; a number is neither here (the
    # database's numbers are the server's own: `astraeus token revoke`)
    reference = str(number) if number is not None else token

    async def work(session: AsyncSession) -> ApiToken:
        if number is None and token.strip().isdigit():
            raise NotFound("TOKEN_NOT_FOUND", f"No token '{token}'.")
        try:
            row = await access.revoke_token(session, info.context.clock, principal, reference)
        except NotFound:  # in the caller's words, never the number behind its id
            raise NotFound("TOKEN_NOT_FOUND", f"No token '{token}'.") from None
        return ApiToken.of(row, codec)

    return await mutate(
        info,
        work,
        lambda revoked: ApiTokenPayload(token=revoked, errors=[]),
        lambda errors: ApiTokenPayload(token=None, errors=errors),
    )
