"""While the database does not answer (restarting, unreachable), the API says so clearly and
the caller may try again: REST 503 DATABASE_UNAVAILABLE, GraphQL errors with that code
(issue 9: what the user sees in the meantime)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

from backend.app import create_app
from backend.db import Database
from backend.db.retries import database_away
from tests.support import server_settings

AWAY = "Astraeus cannot reach its database just now; try again in a moment."
# Nothing listens on port 1: every connection is refused, as while PostgreSQL restarts.
NOWHERE = "postgresql://postgres@127.0.0.1:1/astraeus"


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Starlette]:
    settings = server_settings(NOWHERE, tmp_path)
    database = Database.from_url(NOWHERE, pool_size=1)
    application = create_app(settings, database=database)
    async with application.router.lifespan_context(application):
        yield application
    await database.dispose()


async def test_rest_and_graphql_say_the_database_is_away(app: Starlette) -> None:
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": "Bearer astx_" + "1" * 40}
    async with httpx.AsyncClient(transport=transport, base_url="http://a.test") as client:
        rest = await client.get("/v1/jobs/llama-sft", headers=headers)
        assert rest.status_code == 503
        assert rest.json() == {"code": "DATABASE_UNAVAILABLE", "message": AWAY}
        graphql = await client.post(
            "/graphql", json={"query": "{ viewer { user } runs { name } }"}, headers=headers
        )
        assert graphql.status_code == 200
        errors = graphql.json()["errors"]
        assert {e["message"] for e in errors} == {AWAY}
        assert {e["extensions"]["code"] for e in errors} == {"DATABASE_UNAVAILABLE"}
        assert (await client.get("/healthz")).status_code == 200  # the process itself lives


def test_what_counts_as_away() -> None:
    import psycopg
    from sqlalchemy.exc import OperationalError

    refused = psycopg.OperationalError("connection refused")
    assert database_away(OperationalError("SELECT 1", {}, refused))
    assert database_away(ConnectionRefusedError())
    assert not database_away(ValueError("a bug"))
    # SQLite's busy file is not "away": it is contention, said CONFLICT_RETRY (409)
    import sqlite3

    assert not database_away(OperationalError("SELECT 1", {}, sqlite3.OperationalError("locked")))
