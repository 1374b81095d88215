"""GraphQL types of machine identity: join tokens and machines' own credentials."""

from __future__ import annotations

from datetime import datetime

import strawberry

from backend.models import JoinToken as JoinTokenRow
from backend.models import MachineCredential as CredentialRow
from backend.schema.common import UserError


@strawberry.type(description="A token machines exchange once for a credential of their own.")
class JoinToken:
    id: int
    prefix: str = strawberry.field(description="Its first characters, to tell tokens apart.")
    name: str
    legacy: bool = strawberry.field(
        description="A cluster machine token made before machines had credentials: it joins "
        "and connects machines without a credential of their own until it is revoked."
    )
    expires_at: datetime | None = strawberry.field(description="None only for a legacy token.")
    uses_left: int | None = strawberry.field(description="None: any number (legacy).")
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def from_model(cls, row: JoinTokenRow) -> JoinToken:
        return cls(
            id=row.id,
            prefix=row.prefix,
            name=row.name,
            legacy=row.legacy,
            expires_at=row.expires_at,
            uses_left=row.uses_left,
            created_at=row.created_at,
            last_used_at=row.last_used_at,
            revoked_at=row.revoked_at,
        )


@strawberry.type(description="A machine's own credential: it registers that machine alone.")
class MachineCredential:
    id: int
    machine: str
    prefix: str
    join_token_id: int | None = strawberry.field(description="The join token it was made from.")
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def from_model(cls, row: CredentialRow) -> MachineCredential:
        return cls(
            id=row.id,
            machine=row.machine,
            prefix=row.prefix,
            join_token_id=row.join_token_id,
            created_at=row.created_at,
            last_used_at=row.last_used_at,
            revoked_at=row.revoked_at,
        )


@strawberry.type
class JoinTokenPayload:
    join_token: JoinToken | None
    secret: str | None = strawberry.field(description="The token itself, shown this once.")
    errors: list[UserError]


@strawberry.type
class MachineCredentialPayload:
    credentials: list[MachineCredential]
    errors: list[UserError]
