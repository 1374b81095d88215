"""astra sends a request answered CONFLICT_RETRY again (nothing was changed: issue 19), a few
times with growing waits, then says so: through a real server (uvicorn) and PostgreSQL
deadlocks raised by a trigger."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette

from backend.cli.astra.client import CONFLICT_TRIES, EXIT_UNREACHABLE, Api, CliError, Target
from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.contention import Losing, conflicting_reads, postgresql_only

SET = 'mutation { setSecret(name: "k", value: "%s") { secret { name } errors { code message } } }'


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[str]:
    """The app on a loopback port, in this event loop: the REST base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 (uvicorn has no event for it)
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await task


class Counting(Api):
    """The CLI's client, counting its waits before sending again."""

    waits = 0

    def wait_before(self, attempt: int) -> None:
        self.waits += 1
        super().wait_before(attempt)


async def test_a_mutation_answered_conflict_retry_is_sent_again(
    app: Starlette, db: Database, tenancy: Tenancy, losing: Losing
) -> None:
    postgresql_only(db)
    async with serving(app) as api:
        cli = Counting(Target(api=api, token=tenancy.member_token))
        await losing("secrets", 7)  # the server's 5 tries lose, then 2 of its next
        data = await asyncio.to_thread(cli.graphql, SET % "one")
        assert data["setSecret"] == {"secret": {"name": "k"}, "errors": []}
        assert cli.waits == 1
        await losing("secrets", 1000)  # every try loses
        with pytest.raises(CliError) as refused:
            await asyncio.to_thread(cli.graphql, SET % "two")
    assert refused.value.exit_code == EXIT_UNREACHABLE
    assert str(refused.value) == (
        "astra: Other requests changed the same things at once and this one gave way; nothing "
        f"was changed: send it again. (sent {CONFLICT_TRIES} times, each time other requests "
        "were changing the same things: try again in a moment)"
    )
    assert cli.waits == 1 + CONFLICT_TRIES - 1


async def test_a_rest_read_answered_409_conflict_retry_is_sent_again_then_said(
    app: Starlette, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    postgresql_only(db)
    await World(db, clock, tenancy).submit(name="r-00")  # an event to read
    async with serving(app) as api, conflicting_reads(db):
        cli = Counting(Target(api=api, token=tenancy.member_token))
        with pytest.raises(CliError) as refused:
            await asyncio.to_thread(cli.get, "/orgs/default/workspaces/default/events")
    assert refused.value.exit_code == EXIT_UNREACHABLE
    assert f"(sent {CONFLICT_TRIES} times" in str(refused.value)
    assert cli.waits == CONFLICT_TRIES - 1
