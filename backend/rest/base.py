"""What every REST route shares: the bearer token, a session, errors as JSON."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import MISSING
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backend.access import service as access
from backend.access.rules import Principal, bearer_secret
from backend.boundary import BodyTooLarge, has_control_characters
from backend.clock import Clock
from backend.db import Database
from backend.db.retries import contention, database_away
from backend.errors import (
    AstraeusError,
    ConflictRetry,
    DatabaseUnavailable,
    FieldError,
    InvalidInput,
)
from backend.rest import answers

log = logging.getLogger(__name__)


@dataclass
class Call:
    """One REST call: the request, who made it, and a session for its work."""

    request: Request
    principal: Principal
    session: AsyncSession
    clock: Clock


def error_response(error: AstraeusError) -> JSONResponse:
    body = answers.Error(
        code=error.code,
        message=error.message,
        errors=[answers.FieldProblem(field=f.field, reason=f.reason) for f in error.fields]
        if error.fields
        else MISSING,
    )
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return body.response(error.status, headers)


def bearer(request: Request) -> str | None:
    return bearer_secret(request.headers.get("authorization"))


def refused_parameters(request: Request) -> list[FieldError]:
    """Path and query parameters holding NUL or another control character, each named (NUL
    reached PostgreSQL as an error: a 500). Checked before the token is looked up."""
    given = [*request.path_params.items(), *request.query_params.multi_items()]
    names = dict.fromkeys(
        ascii(n) if has_control_characters(n) else n
        for n, v in given
        if has_control_characters(n) or has_control_characters(v)
    )
    return [FieldError(n, "must not hold NUL or other control characters") for n in names]


def endpoint(
    handler: Callable[[Call], Awaitable[Response]], *, write: bool = False
) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a route: authenticate, own the transaction, turn expected errors into JSON."""

    async def route(request: Request) -> Response:
        refused = refused_parameters(request)
        if refused:
            return error_response(InvalidInput("INVALID_PARAMETER", refused))
        db: Database = request.app.state.db
        clock: Clock = request.app.state.clock

        async def work(session: AsyncSession) -> Response:
            principal = await access.authenticate(session, bearer(request), clock.now())
            request.app.state.token_uses.note(principal, clock.now())
            return await handler(Call(request, principal, session, clock))

        async def run() -> Response:
            if write:  # tried again whole if it lost to another transaction (db.unit)
                return await db.unit(work)
            async with db.read() as session:
                return await work(session)

        return await guarded(request, run)

    return route


async def guarded(request: Request, run: Callable[[], Awaitable[Response]]) -> Response:
    """A route's answer, its expected errors as JSON: a refusal, the database away or busy,
    else a 500 whose cause stays in the server's log."""
    try:
        return await run()
    except AstraeusError as error:
        return error_response(error)
    except BodyTooLarge:
        raise  # the body limit's own answer, 413 (backend/boundary.py)
    except Exception as error:
        if contention(error):  # a read that lost to a writer (SQLite's locked file)
            log.warning("gave way to others: %s %s", request.method, request.url.path)
            return error_response(ConflictRetry())
        if database_away(error):
            log.warning("the database is away: %s %s", request.method, request.url.path)
            return error_response(DatabaseUnavailable())
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        internal = answers.Error(code="INTERNAL", message="Unexpected error; it has been logged.")
        return internal.response(500)
