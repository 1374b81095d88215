"""Events reach every subscriber once each and in id order, though their writers commit out of
id order (issue 19: 18 of 20 subscribers got events out of order, which broke a client
resuming with ``after``); a subscriber resuming after the last id it got misses nothing and
gets nothing twice."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from backend.db import Database
from backend.ids import Kind
from backend.models import Event, Workspace
from backend.request.context import build_context
from backend.resolvers.root import schema
from tests.support import SEED_TIME, FakeClock, Tenancy
from tests.support.api import gql
from tests.support.ids import opened, shown
from tests.support.subscriptions import leave

WRITERS = 6
EACH = 5  # events per writer
SUBSCRIBERS = 20


async def workspace_ids(db: Database) -> tuple[int, int, int]:
    async with db.read() as session:
        ws = await session.scalar(select(Workspace).where(Workspace.name == "default"))
        assert ws is not None
        newest = await session.scalar(select(func.max(Event.id)))
        return ws.organization_id, ws.id, int(newest or 0)


async def write_late(db: Database, organization: int, workspace: int, seed: int) -> list[int]:
    """EACH events, each in a transaction that takes its id, then waits before committing:
    one that took a smaller id often commits after another's larger one (PostgreSQL)."""
    chance = random.Random(seed)
    ids = []
    for n in range(EACH):
        async with db.transaction() as session:
            event = Event(
                organization_id=organization,
                workspace_id=workspace,
                kind="quota",
                reason=f"writer {seed}, event {n}",
                data={},
                created_at=SEED_TIME,
            )
            session.add(event)
            await session.flush()  # its id is taken
            ids.append(event.id)
            await asyncio.sleep(chance.uniform(0.0, 0.6))
    return ids


async def subscribe(
    db: Database, clock: FakeClock, token: str, after: int
) -> AsyncGenerator[Any, None]:
    context = await build_context(db, clock, f"Bearer {token}")
    results = await schema.subscribe(
        "subscription($after: ID) { events(after: $after) { id } }",
        context_value=context,
        variable_values={"after": await shown(db, Kind.EVENT, after)},
    )
    assert hasattr(results, "__aiter__"), results
    return results


async def collect(results: AsyncGenerator[Any, None], count: int) -> list[int]:
    got: list[int] = []
    async for result in results:
        assert result.errors is None, result.errors
        got.append(opened(Kind.EVENT, result.data["events"]["id"]))
        if len(got) == count:
            break
    await leave(results)
    return got


async def test_every_subscriber_gets_every_event_once_in_id_order(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    organization, workspace, start = await workspace_ids(db)
    total = WRITERS * EACH
    subscribers = [
        await subscribe(db, clock, tenancy.member_token, start) for _ in range(SUBSCRIBERS)
    ]
    readers = [asyncio.create_task(collect(s, total)) for s in subscribers]
    # one that stops after a third of them, and resumes after the last id it got
    resumer = asyncio.create_task(
        collect(await subscribe(db, clock, tenancy.member_token, start), total // 3)
    )
    writers = [write_late(db, organization, workspace, seed) for seed in range(WRITERS)]
    written = sorted(i for ids in await asyncio.gather(*writers) for i in ids)
    assert len(written) == total
    async with asyncio.timeout(20):
        first_part = await resumer
        rest = await collect(
            await subscribe(db, clock, tenancy.member_token, first_part[-1]),
            total - len(first_part),
        )
        got = await asyncio.gather(*readers)
    out_of_order = [g for g in got if g != written]
    assert not out_of_order, f"{len(out_of_order)} of {SUBSCRIBERS} out of order: {out_of_order[0]}"
    assert first_part + rest == written


async def test_a_listing_stops_below_an_event_still_to_commit(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # `astra events -f` lists the newest events, then follows after the newest it listed
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: its ids become visible in order")
    organization, workspace, _ = await workspace_ids(db)
    headers = {"Authorization": f"Bearer {tenancy.member_token}"}
    path = "/v1/orgs/default/workspaces/default/events"

    async def listed() -> list[int]:
        answer = await client.get(path, headers=headers)
        assert answer.status_code == 200, answer.text
        rest = [e["id"] for e in answer.json()["events"]]
        page = await gql(client, tenancy.member_token, "{ events { events { id } } }")
        assert [e["id"] for e in page["data"]["events"]["events"]] == rest
        return [opened(Kind.EVENT, shown_id) for shown_id in rest]

    async with db.transaction() as late:
        event = Event(
            organization_id=organization,
            workspace_id=workspace,
            kind="quota",
            reason="committed late",
            data={},
            created_at=SEED_TIME,
        )
        late.add(event)
        await late.flush()  # its id is taken
        newer = await write_late(db, organization, workspace, seed=99)  # committed first
        assert await listed() == []  # not the newer ones: a follower after them misses it
    assert await listed() == sorted([event.id, *newer], reverse=True)
