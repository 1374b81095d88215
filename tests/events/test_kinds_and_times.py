"""Issue 21: a deletion is a run.deleted event (it was a run.state of state Deleted, so
?kind=run.deleted found none), rows written before read the same; a stall keeps when it
happened and when it was found, listed in the order found (seed L-43, L-46, G-6)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import select

from backend.accounting import counting
from backend.clock import iso_z
from backend.db import Database
from backend.ids import Kind
from backend.lifecycle import service as lifecycle
from backend.models import Event
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import auth
from tests.support.ids import opened

EVENTS = "/v1/orgs/default/workspaces/default/events"
GRAPHQL_EVENTS = """query($kind: String) { events(kind: $kind, limit: 50) {
  events { id kind state createdAt foundAt } } }"""


async def listed(client: httpx.AsyncClient, token: str, **params: str) -> list[dict[str, Any]]:
    answer = await client.get(EVENTS, params=params, headers=auth(token))
    assert answer.status_code == 200, answer.text
    return list(answer.json()["events"])


async def running(world: World, **spec: Any) -> None:
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=1, **spec)
    world.clock.advance(seconds=1)
    await world.schedule()
    world.clock.advance(seconds=1)
    await world.start("llama-sft-0")


async def test_a_deletion_is_a_run_deleted_event(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # seed L-43: the kinds include run.deleted; the console's filter asks ?kind=run.deleted
    world = World(db, clock, tenancy)
    await running(world)
    clock.advance(minutes=1)
    async with db.transaction() as session:
        await lifecycle.delete_run(
            session, clock, await world.run("llama-sft"), "alice", ledger=counting
        )
    deleted = await listed(client, tenancy.member_token, kind="run.deleted")
    assert [(e["kind"], e["state"], e["reason"]) for e in deleted] == [
        ("run.deleted", "Deleted", "Deleted by alice")
    ]
    states = await listed(client, tenancy.member_token, kind="run.state")
    assert states and "Deleted" not in {e["state"] for e in states}
    # another workspace's token sees none of it
    other = await client.get(
        "/v1/orgs/default/workspaces/team-b/events",
        params={"kind": "run.deleted"},
        headers=auth(tenancy.other_token),
    )
    assert other.status_code == 200 and other.json()["events"] == []
    foreign = await client.get(
        EVENTS, params={"kind": "run.deleted"}, headers=auth(tenancy.foreign_token)
    )
    assert foreign.status_code == 404


async def test_a_deletion_written_before_reads_as_run_deleted(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await running(world)
    async with db.transaction() as session:
        await lifecycle.delete_run(
            session, clock, await world.run("llama-sft"), "alice", ledger=counting
        )
        row = await session.scalar(select(Event).where(Event.kind == "run.deleted"))
        assert row is not None
        row.kind = "run.state"  # as a server before issue 21 wrote it
    deleted = await listed(client, tenancy.member_token, kind="run.deleted")
    assert [(e["kind"], e["state"]) for e in deleted] == [("run.deleted", "Deleted")]
    everything = await listed(client, tenancy.member_token)
    assert [e["kind"] for e in everything].count("run.deleted") == 1
    states = await listed(client, tenancy.member_token, kind="run.state")
    assert "Deleted" not in {e["state"] for e in states}


async def test_a_stall_keeps_when_it_happened_and_when_it_was_found(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # seed G-6: stalled from when it stopped making progress; found a stall timeout later
    world = World(db, clock, tenancy)
    await running(world, stall_timeout="30m", on_stall="keep")
    clock.advance(minutes=5)
    await world.report("llama-sft-0", "progress")
    last_progress = clock.now()
    clock.advance(minutes=10)
    await world.submit(name="sweep-7", workers=1, gpus=1)  # happens after the stall began
    clock.advance(minutes=20)
    found = clock.now()
    await world.timers()
    events = await listed(client, tenancy.member_token)
    numbers = [opened(Kind.EVENT, e["id"]) for e in events]
    assert numbers == sorted(numbers, reverse=True)
    stalled = [e for e in events if e["data"].get("phase") == "stalled"]
    assert len(stalled) == 1
    stall = stalled[0]
    assert stall["created_at"] == iso_z(last_progress)
    assert stall["found_at"] == iso_z(found)
    assert "found_at" not in stall["data"]
    # newer in the list is found no earlier: ordered by when found, whatever when it happened
    found_times = [e["found_at"] for e in events]
    assert found_times == sorted(found_times, reverse=True)
    assert any(e["created_at"] > stall["created_at"] for e in events[events.index(stall) + 1 :])
    # the others were found as they happened
    assert all(e["found_at"] == e["created_at"] for e in events if e is not stall)
    answer = await client.post(
        "/graphql",
        json={"query": GRAPHQL_EVENTS, "variables": {}},
        headers=auth(tenancy.member_token),
    )
    shown = {e["id"]: e for e in answer.json()["data"]["events"]["events"]}[stall["id"]]
    assert shown["foundAt"] > shown["createdAt"]
    assert found - last_progress == timedelta(minutes=30)
