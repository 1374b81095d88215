"""A GraphQL request's budget (issue 18): its time, and the database sessions its workspace's
requests hold together, so that one workspace's heavy requests leave the others answering."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import httpx

from backend.app import create_app
from backend.config import Settings
from backend.db import Database
from tests.support import FakeClock, Tenancy

RUNS = "{ runs { name } viewer { workspace } }"


@asynccontextmanager
async def serving(
    settings: Settings, db: Database, clock: FakeClock, **changed: Any
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update=changed), clock=clock, database=db)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://astraeus.test") as c:
            c.app = app  # type: ignore[attr-defined]
            yield c


async def ask(client: httpx.AsyncClient, token: str, query: str) -> dict[str, Any]:
    answer = await client.post(
        "/graphql", json={"query": query}, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200
    return dict(answer.json())


async def test_a_request_past_its_time_budget_is_cut(
    settings: Settings, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    async with serving(settings, db, clock, graphql_time_budget=timedelta(microseconds=1)) as c:
        body = await ask(c, tenancy.member_token, RUNS)
    assert body["data"] is None
    assert body["errors"][0]["extensions"] == {"code": "TIME_BUDGET_EXCEEDED"}
    assert "time budget of 1e-06 s" in body["errors"][0]["message"]


async def test_one_workspace_holding_its_sessions_leaves_another_answering(
    settings: Settings, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """default's requests hold both of its sessions (as two heavy requests would); its next
    request waits and is cut at the budget, while team-b's answers at once."""
    async with serving(
        settings,
        db,
        clock,
        graphql_sessions_per_workspace=2,
        graphql_time_budget=timedelta(seconds=2),
    ) as c:
        first = await ask(c, tenancy.member_token, RUNS)  # default's gate, made at its first
        assert first["data"]["viewer"]["workspace"] == "default"
        gates: dict[Any, asyncio.Semaphore] = c.app.state.gates  # type: ignore[attr-defined]
        [default_gate] = gates.values()
        async with default_gate, default_gate:
            waiting = asyncio.create_task(ask(c, tenancy.admin_token, RUNS))
            theirs = await asyncio.wait_for(ask(c, tenancy.other_token, RUNS), 5)
            assert theirs == {"data": {"runs": [], "viewer": {"workspace": "team-b"}}}
            cut = await waiting
        assert cut["errors"][0]["extensions"] == {"code": "TIME_BUDGET_EXCEEDED"}
        # the gate is whole again: default answers
        again = await ask(c, tenancy.admin_token, RUNS)
        assert again["data"]["viewer"]["workspace"] == "default"
