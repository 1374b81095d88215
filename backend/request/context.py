"""The typed per-request context every resolver receives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession
from starlette.websockets import WebSocket
from strawberry.types import Info as StrawberryInfo

from backend.access import service as access
from backend.access.rules import Principal, bearer_secret
from backend.access.service import TokenUses
from backend.clock import Clock
from backend.db import Database
from backend.db.retries import database_away
from backend.errors import DatabaseUnavailable, Unauthenticated
from backend.logs.service import LogSource
from backend.request.loaders import Loaders
from backend.webhooks.addresses import Policy


class SharedDatabase(Database):
    """The database as one workspace's requests reach it: at most as many sessions open at once
    as its gate lets through, all its requests together; a resolver waits for its turn. Two
    requests of 1 000 aliases each took every connection, and another workspace's
    ``GET /v1/jobs/…`` waited 47 s."""

    def __init__(self, db: Database, gate: asyncio.Semaphore) -> None:
        super().__init__(db.engine)
        self.gate = gate

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        async with self.gate, super().transaction() as session:
            yield session

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self.gate, super().read() as session:
            yield session


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
    # The WebSocket this context serves (None over HTTP): closed once its token is refused.
    websocket: WebSocket | None = None
    # Where webhooks may be sent: the admin's allow-list, the server's own addresses and ports.
    webhook_policy: Policy = field(default_factory=Policy)
    # Where a token's use is noted (written once a minute: access.TokenUses); None in tests of
    # resolvers built without an app.
    token_uses: TokenUses | None = None
    # Each workspace's gate on the threads checking new documents (backend/schema/guards.py);
    # None in tests of resolvers built without an app.
    checking_gates: dict[tuple[int, int | None], asyncio.Semaphore] | None = None
    loaders: Loaders = field(init=False)

    def __post_init__(self) -> None:
        self.loaders = Loaders.build(self.db, self.clock, self.require_principal)

    def share(self, gates: dict[tuple[int, int | None], asyncio.Semaphore], size: int) -> None:
        """Resolvers and loaders reach the database through the gate of the caller's workspace
        (made at its first request): its requests together hold at most ``size`` sessions."""
        if self.principal is None:
            return  # refused before any resolver runs
        key = (self.principal.organization_id, self.principal.workspace_id)
        gate = gates.setdefault(key, asyncio.Semaphore(size))
        self.db = SharedDatabase(self.db, gate)
        self.loaders = Loaders.build(self.db, self.clock, self.require_principal)

    def checking_gate(self) -> asyncio.Semaphore | None:
        """The gate of the caller's workspace on the checking threads: its new documents are
        checked one at a time, so its own wait behind each other, not another workspace's."""
        if self.checking_gates is None or self.principal is None:
            return None
        key = (self.principal.organization_id, self.principal.workspace_id)
        return self.checking_gates.setdefault(key, asyncio.Semaphore(1))

    async def authenticate_connection(self) -> bool:
        """A WebSocket without an Authorization header: its token from connection_init
        (``{"Authorization": "Bearer …"}``). Whether the connection may go on."""
        if self.principal is not None:
            return True
        params = self.connection_params or {}
        header = params.get("Authorization", params.get("authorization"))
        if not isinstance(header, str):
            return False
        found, self.auth_error, self.database_away = await _principal(
            self.db, bearer_secret(header), self.clock
        )
        if found is not None and self.token_uses is not None:
            self.token_uses.note(found, self.clock.now())
        self.principal = found
        return found is not None

    def require_principal(self) -> Principal:
        if self.database_away:
            raise DatabaseUnavailable()
        if self.principal is None:
            raise Unauthenticated(self.auth_error or "An API token is required.")
        return self.principal


async def _principal(
    db: Database, secret: str | None, clock: Clock
) -> tuple[Principal | None, str | None, bool]:
    """Who the token is, else why not; and whether the database was away."""
    try:
        async with db.read() as session:
            return await access.authenticate(session, secret, clock.now()), None, False
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
    principal, error, away = await _principal(db, bearer_secret(authorization), clock)
    context = Context(
        db=db, clock=clock, principal=principal, auth_error=error, logs=logs, database_away=away
    )
    if metrics_retention is not None:
        context.metrics_retention = metrics_retention
    return context


Info = StrawberryInfo[Context, None]
