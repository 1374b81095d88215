"""The typed per-request context every resolver receives."""

from __future__ import annotations

from dataclasses import dataclass, field

from strawberry.types import Info as StrawberryInfo

from backend.access import service as access
from backend.access.rules import Principal
from backend.clock import Clock
from backend.db import Database
from backend.errors import Unauthenticated
from backend.resolvers.loaders import Loaders


@dataclass
class Context:
    db: Database
    clock: Clock
    principal: Principal | None
    # Why there is no principal, said to the caller by the permission that refuses it.
    auth_error: str | None
    loaders: Loaders = field(init=False)

    def __post_init__(self) -> None:
        self.loaders = Loaders.build(self.db, self.clock)

    def require_principal(self) -> Principal:
        if self.principal is None:
            raise Unauthenticated(self.auth_error or "An API token is required.")
        return self.principal


async def build_context(db: Database, clock: Clock, authorization: str | None) -> Context:
    secret = None
    if authorization and authorization.lower().startswith("bearer "):
        secret = authorization[7:].strip()
    try:
        async with db.read() as session:
            principal: Principal | None = await access.authenticate(session, secret)
        error = None
    except Unauthenticated as exc:
        principal, error = None, exc.message
    return Context(db=db, clock=clock, principal=principal, auth_error=error)


Info = StrawberryInfo[Context, None]
