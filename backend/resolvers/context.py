"""The typed per-request context every resolver receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from strawberry.types import Info as StrawberryInfo

from backend.access import service as access
from backend.access.rules import Principal
from backend.clock import Clock
from backend.db import Database
from backend.errors import Unauthenticated
from backend.logs.service import LogSource
from backend.resolvers.loaders import Loaders


@dataclass
class Context:
    db: Database
    clock: Clock
    principal: Principal | None
    # Why there is no principal, said to the caller by the permission that refuses it.
    auth_error: str | None
    # Whoever can ask a machine for a log (None: this server takes no agents).
    logs: LogSource | None = None
    # How long raw samples are kept: a range query past it reads the one-minute values.
    metrics_retention: timedelta = timedelta(days=15)
    # A WebSocket's connection_init payload: where a browser puts its token.
    connection_params: dict[str, object] | None = None
    loaders: Loaders = field(init=False)

    def __post_init__(self) -> None:
        self.loaders = Loaders.build(self.db, self.clock)

    async def authenticate_connection(self) -> bool:
        """A WebSocket without an Authorization header: its token from connection_init
        (``{"Authorization": "Bearer …"}``). Whether the connection may go on."""
        if self.principal is not None:
            return True
        params = self.connection_params or {}
        header = params.get("Authorization", params.get("authorization"))
        if not isinstance(header, str):
            return False
        found, self.auth_error = await _principal(self.db, _secret(header))
        self.principal = found
        return found is not None

    def require_principal(self) -> Principal:
        if self.principal is None:
            raise Unauthenticated(self.auth_error or "An API token is required.")
        return self.principal


def _secret(authorization: str | None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


async def _principal(db: Database, secret: str | None) -> tuple[Principal | None, str | None]:
    try:
        async with db.read() as session:
            return await access.authenticate(session, secret), None
    except Unauthenticated as exc:
        return None, exc.message


async def build_context(
    db: Database,
    clock: Clock,
    authorization: str | None,
    logs: LogSource | None = None,
    metrics_retention: timedelta | None = None,
) -> Context:
    principal, error = await _principal(db, _secret(authorization))
    context = Context(db=db, clock=clock, principal=principal, auth_error=error, logs=logs)
    if metrics_retention is not None:
        context.metrics_retention = metrics_retention
    return context


Info = StrawberryInfo[Context, None]
