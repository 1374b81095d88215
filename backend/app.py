"""The Starlette application: GraphQL at /graphql, the REST shim at /v1, the console at /."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from graphql import GraphQLError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Scope
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http import GraphQLRequestData
from strawberry.http.async_base_view import AsyncHTTPRequestAdapter
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.types import ExecutionResult
from strawberry.types.execution import SubscriptionExecutionResult
from strawberry.types.unset import UNSET, UnsetType

from backend import migrations
from backend.access import service as access
from backend.access.watch import watch_of
from backend.boundary import BodyLimit, SecurityHeaders
from backend.clock import Clock, SystemClock
from backend.code.rules import upload_limit
from backend.config import Settings, get_settings
from backend.db import Database
from backend.db.notices import Notices
from backend.errors import DatabaseUnavailable
from backend.gateway import routing
from backend.gateway.delivery import POLL_EMBEDDED_S, POLL_S
from backend.gateway.routing import LogRouter
from backend.gateway.servicer import AgentService
from backend.gateway.servicer import serve as serve_agents
from backend.jobs import broker as job_broker
from backend.jobs import runtime
from backend.request.context import Context, build_context
from backend.resolvers.permissions import IsAuthenticated
from backend.resolvers.root import schema
from backend.rest import code as rest_code
from backend.rest import events as rest_events
from backend.rest import goodput as rest_goodput
from backend.rest import jobs as rest_jobs
from backend.rest import metrics as rest_metrics
from backend.rest import openapi as rest_openapi
from backend.rest import queues as rest_queues
from backend.rest import tasks as rest_tasks
from backend.schema.guards import log_errors
from backend.tls import server_tls
from backend.webhooks import service as webhooks

log = logging.getLogger(__name__)


class AstraeusGraphQL(GraphQL[Context, None]):
    """GraphQL over HTTP, and over WebSockets (graphql-transport-ws) for subscriptions."""

    async def get_context(self, request: object, response: object) -> Context:
        app = request.scope["app"]  # type: ignore[attr-defined]
        authorization = request.headers.get("authorization")  # type: ignore[attr-defined]
        logs = getattr(app.state, "agents", None)
        retention = app.state.settings.metrics_retention
        context = await build_context(app.state.db, app.state.clock, authorization, logs, retention)
        context.token_uses = app.state.token_uses
        if context.principal is not None:
            context.token_uses.note(context.principal, app.state.clock.now())
        context.webhook_policy = webhooks.policy(app.state.settings)
        context.checking_gates = app.state.checking_gates
        if isinstance(request, WebSocket):
            context.websocket = request
        else:
            settings: Settings = app.state.settings
            context.share(app.state.gates, settings.graphql_sessions_per_workspace)
        return context

    def decode_json(self, data: str | bytes) -> object:
        """JSON nested past the interpreter's recursion limit (a body of 5 000 nested lists)
        is JSON that cannot be read: 400 (a WebSocket's message: closed 4400), not a 500 with
        a traceback for an anonymous body (issue 37 N1)."""
        try:
            return super().decode_json(data)
        except RecursionError:
            raise json.JSONDecodeError("nested too deeply", "", 0) from None

    async def execute_operation(
        self,
        request: Request,
        request_adapter: AsyncHTTPRequestAdapter,
        request_data: GraphQLRequestData | list[GraphQLRequestData],
        context: Context,
        root_value: None,
        sub_response: Response,
    ) -> ExecutionResult | list[ExecutionResult] | SubscriptionExecutionResult:
        """A query or mutation over HTTP within the request's time budget; past it, its
        resolvers are cancelled (their sessions closed, a mutation's transaction rolled back).
        A caller without a valid token is refused before its document is even parsed: every
        field asks for one, and an anonymous document cost the server 16-51 s (issue 37 N1)."""
        if context.principal is None:
            return refused_anonymous(context)
        budget = request.app.state.settings.graphql_time_budget.total_seconds()
        try:
            async with asyncio.timeout(budget):
                return await super().execute_operation(
                    request, request_adapter, request_data, context, root_value, sub_response
                )
        except TimeoutError:
            log.warning("graphql refused: TIME_BUDGET_EXCEEDED after %g s", budget)
            message = f"The request ran past its time budget of {budget:g} s; ask for less."
            error = GraphQLError(message, extensions={"code": "TIME_BUDGET_EXCEEDED"})
            return ExecutionResult(data=None, errors=[error])

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """A browser cannot set headers on a WebSocket: its token comes in connection_init.
        Without a valid one the connection is closed (4403)."""
        if not await context.authenticate_connection():
            # 4403 either way; the message says whether the token or the database is at fault
            raise ConnectionRejectionError(
                {"message": context.auth_error or "A token is required."}
            )
        if context.websocket is not None and context.principal is not None:
            # closed (4403) once the token is revoked or expires
            watch = watch_of(context.db, context.clock)
            watch.watch_websocket(context.principal.token_id, context.websocket)
        return UNSET


def refused_anonymous(context: Context) -> ExecutionResult:
    """What a request without a valid token gets, as any field would have said it (the
    database being away is said as such), logged in one line."""
    if context.database_away:
        away = DatabaseUnavailable()
        error = GraphQLError(away.message, original_error=away)
    else:
        error = GraphQLError(IsAuthenticated.message, extensions=IsAuthenticated.error_extensions)
    log_errors([error], None)
    return ExecutionResult(data=None, errors=[error])


class ConsoleFiles(StaticFiles):
    """The built console; any path that is not a file is a client route, served index.html."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        try:
            return await super().get_response(path, scope)
        except HTTPException as exc:
            if exc.status_code != 404:
                raise
            return await super().get_response("index.html", scope)


NO_CONSOLE = """<!doctype html><meta charset="utf-8"><title>Astraeus</title>
<h1>Astraeus</h1><p>The API is up: GraphQL at <a href="/graphql">/graphql</a>,
REST at <code>/v1</code>. The console has not been built here; <code>make up</code> builds it.</p>
"""


API_PREFIXES = ("/v1/", "/api/v1/", "/graphql")
# Where a run's code is uploaded, under either prefix of the REST shim.
CODE_PATH = re.compile(r"^(?:/api)?/v1/code/[^/]+$")


async def http_error(request: Request, exc: Exception) -> Response:
    """No route, or not that method: JSON with a code on the API's paths, as every other
    error of the API; plain text elsewhere."""
    assert isinstance(exc, HTTPException)
    if not request.url.path.startswith(API_PREFIXES):
        return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
    message = {
        404: f"No such endpoint: {request.url.path}.",
        405: f"{request.method} is not allowed on {request.url.path}.",
    }.get(exc.status_code, str(exc.detail))
    return JSONResponse(
        {"code": code, "message": message}, status_code=exc.status_code, headers=exc.headers
    )


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def no_console(request: Request) -> Response:
    return HTMLResponse(NO_CONSOLE)


def _console_routes(console_dir: Path) -> list[BaseRoute]:
    if (console_dir / "index.html").is_file():
        return [Mount("/", app=ConsoleFiles(directory=console_dir, html=True), name="console")]
    return [Route("/", no_console)]


@asynccontextmanager
async def _jobs(settings: Settings) -> AsyncIterator[None]:
    """The broker the API sends to; when embedded, the worker and periodic pass run here too."""
    broker = job_broker.install(settings)
    if not settings.runs_jobs_in_process:
        yield
        return
    runtime.configure(settings)
    async with job_broker.in_process_worker(broker):
        ticker = asyncio.create_task(job_broker.periodic(settings))
        try:
            yield
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker


@asynccontextmanager
async def _agent_endpoint(
    settings: Settings, db: Database, clock: Clock
) -> AsyncIterator[LogRouter | None]:
    """The gRPC endpoint machines' agents connect to, in the API process, and the router
    taking a log request to the replica that holds the machine's stream (this one or another)."""
    if not settings.agent_port:
        yield None
        return
    router = routing.for_settings(settings)
    # other processes' commits of commands and revocations, heard (PostgreSQL)
    notices = Notices(settings.resolved_database_url)
    service = AgentService(
        db,
        clock,
        lease=settings.lease_time,
        # every job that writes commands runs in this process, or none does
        poll_interval=POLL_EMBEDDED_S if settings.broker == "embedded" else POLL_S,
        on_freed=job_broker.nudge_scheduler,
        on_stream=router.stream_changed,
        notices=notices,
    )
    async with notices.listening(), router.serving(service):
        tls = server_tls(settings)  # plaintext off loopback is refused here too
        credentials = tls.grpc_credentials() if tls else None
        server = await serve_agents(service, f"{settings.host}:{settings.agent_port}", credentials)
        try:
            yield router
        finally:
            service.close_streams()  # every agent told now, not after the grace (issue 19)
            await server.stop(grace=2)


@asynccontextmanager
async def _token_uses(db: Database) -> AsyncIterator[access.TokenUses]:
    """When tokens were last used, written once a minute and once more as the server stops."""
    uses = access.TokenUses()
    keeping = asyncio.create_task(uses.keep(db))
    try:
        yield uses
    finally:
        keeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeping
        await uses.write(db)


def create_app(
    settings: Settings | None = None,
    *,
    clock: Clock | None = None,
    database: Database | None = None,
) -> Starlette:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if settings.should_migrate_on_start:
            await asyncio.to_thread(migrations.upgrade, settings.resolved_database_url)
        owned = database is None
        app.state.db = database or Database.from_url(
            settings.resolved_database_url,
            pool_size=settings.db_pool_size,
            echo=settings.db_echo,
        )
        app.state.clock = clock or SystemClock()
        app.state.settings = settings
        app.state.gates = {}  # each workspace's gate on its GraphQL sessions
        app.state.code_uploads = Counter()  # each workspace's code uploads under way
        app.state.checking_gates = {}  # each workspace's on the threads checking documents
        async with contextlib.AsyncExitStack() as stack:
            # The agent endpoint first: it gives machines a lease to reconnect before the
            # first scheduling pass looks for expired ones.
            app.state.agents = await stack.enter_async_context(
                _agent_endpoint(settings, app.state.db, app.state.clock)
            )
            await stack.enter_async_context(_jobs(settings))
            app.state.token_uses = await stack.enter_async_context(_token_uses(app.state.db))
            runtime.freeze_what_started()
            try:
                yield
            finally:
                if owned:
                    await app.state.db.dispose()

    # No GraphiQL: it runs inline scripts from a CDN, which the console's policy refuses.
    graphql = AstraeusGraphQL(
        schema, subscription_protocols=[GRAPHQL_TRANSPORT_WS_PROTOCOL], graphql_ide=None
    )
    rest_routes = [
        *rest_jobs.routes,
        *rest_tasks.routes,
        *rest_metrics.routes,
        *rest_goodput.routes,
        *rest_events.routes,
        *rest_openapi.routes,
        *rest_code.routes,
    ]
    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        *rest_queues.routes,  # /metrics: the job queues, for operators
        Route("/graphql", graphql, methods=["GET", "POST"]),
        WebSocketRoute("/graphql", graphql),
        # The REST shim at /v1, and at /api/v1 as the console's address shows it (seed L-46).
        *(Mount(prefix, routes=rest_routes) for prefix in ("/v1", "/api/v1")),
        *_console_routes(settings.resolved_console_dir),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(
                BodyLimit,
                limit=settings.max_body_bytes,
                # a run's code (--workdir) is uploaded as one body
                larger=((CODE_PATH, upload_limit(settings.code_limit_bytes)),),
            ),
        ],
    )
