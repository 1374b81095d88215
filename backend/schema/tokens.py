"""GraphQL types of user API tokens: as listings show them, never their secret."""

from __future__ import annotations

from datetime import datetime

import strawberry

from backend import ids
from backend.access.service import TokenRow
from backend.schema.common import UserError


@strawberry.type(description="A user's API token. Its secret was shown once, when made.")
class ApiToken:
    id: strawberry.ID = strawberry.field(
        description="Opaque, the same every time: it counts nothing (revokeToken takes it)."
    )
    prefix: str = strawberry.field(description="The token's first characters, to tell it apart.")
    name: str
    user: str
    workspace: str | None
    created_at: datetime
    expires_at: datetime | None = strawberry.field(description="Null: it never expires.")
    revoked_at: datetime | None
    last_used_at: datetime | None = strawberry.field(
        description="When a request last came with it (written at most a minute late); null: "
        "never since this was recorded."
    )

    @classmethod
    def of(cls, row: TokenRow, codec: ids.IdCodec) -> ApiToken:
        return cls(
            id=strawberry.ID(codec.show(ids.Kind.TOKEN, row.id)),
            prefix=row.prefix,
            name=row.name,
            user=row.user_name,
            workspace=row.workspace_name,
            created_at=row.created_at,
            expires_at=row.expires_at,
            revoked_at=row.revoked_at,
            last_used_at=row.last_used_at,
        )


@strawberry.type
class ApiTokenPayload:
    token: ApiToken | None
    errors: list[UserError]
