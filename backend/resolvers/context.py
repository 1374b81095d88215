"""The typed per-request context every resolver receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from strawberry.types import Info as StrawberryInfo

from backend.access import service as access
from backend.access.rules import Principal
from backend.clock import Clock
from backend.db import Database, database_away
from backend.errors import DatabaseUnavailable, Unauthenticated
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
    # The database did not answer when the token was looked up: every field says so.
    database_away: bool = False
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
        found, self.auth_error, self.database_away = await _principal(self.db, _secret(header))
        self.principal = found
        return found is not None

    def require_principal(self) -> Principal:
        if self.database_away:
            raise DatabaseUnavailable()
        if self.principal is None:
            raise Unauthenticated(self.auth_error or "An API token is required.")
        return self.principal


def _secret(authorization: str | None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


async def _principal(db: Database, secret: str | None) -> tuple[Principal | None, str | None, bool]:
    """Who the token is, else why not; and whether the database was away."""
    try:
        async with db.read() as session:
            return await access.authenticate(session, secret), None, False
    except Unauthenticated as exc:
        return None, exc.message, False
    except Exception as exc:
        if database_away(exc):
            return None, DatabaseUnavailable().message, True
        raise


async def build_context(
    db: Database,
    clock: Clock,
    authorization: str | None,
    logs: LogSource | None = None,
    metrics_retention: timedelta | None = None,
) -> Context:
    principal, error, away = await _principal(db, _secret(authorization))
    context = Context(
        db=db, clock=clock, principal=principal, auth_error=error, logs=logs, database_away=away
    )
    if metrics_retention is not None:
        context.metrics_retention = metrics_retention
    return context


Info = StrawberryInfo[Context, None]
