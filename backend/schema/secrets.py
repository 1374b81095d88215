"""GraphQL types of a workspace's secrets: names and state, never values."""

from __future__ import annotations

from datetime import datetime

import strawberry

from backend import models
from backend.schema.common import UserError


@strawberry.type(description="A credential of the workspace. Its value is never shown.")
class Secret:
    name: str
    external: bool = strawberry.field(
        description="Declared to be filled in by a secret manager rather than set here."
    )
    is_set: bool = strawberry.field(
        description="It has a value; workers naming it wait while Preparing until it has."
    )
    updated_at: datetime

    @classmethod
    def from_model(cls, row: models.Secret) -> Secret:
        return cls(
            name=row.name,
            external=row.external,
            is_set=row.value is not None,
            updated_at=row.updated_at,
        )


@strawberry.type
class SecretPayload:
    secret: Secret | None
    errors: list[UserError]
