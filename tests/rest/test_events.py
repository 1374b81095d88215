"""GET /api/v1/orgs/<org>/workspaces/<workspace>/events?name=<run>&limit=50 (seed L-44, L-46)."""

import httpx

from backend.db import Database
from backend.ids import Kind
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import auth
from tests.support.ids import opened

EVENTS = "/api/v1/orgs/default/workspaces/default/events"


async def two_runs(db: Database, clock: FakeClock, tenancy: Tenancy) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=1)
    clock.advance(seconds=1)
    await world.submit(name="sweep-7", workers=1, gpus=1)
    clock.advance(seconds=1)
    await world.schedule()


async def test_a_runs_events_newest_first_page_by_page(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # seed L-46: the workspace's events, across clusters, ?name=<run>&limit=50
    await two_runs(db, clock, tenancy)
    answer = await client.get(
        EVENTS, params={"name": "llama-sft", "limit": "50"}, headers=auth(tenancy.member_token)
    )
    assert answer.status_code == 200
    events = answer.json()["events"]
    assert events and all(e["run"] == "llama-sft" for e in events)
    numbers = [opened(Kind.EVENT, e["id"]) for e in events]
    assert numbers == sorted(numbers, reverse=True)
    assert set(events[0]) == {
        "id",
        "kind",
        "state",
        "reason",
        "run",
        "worker",
        "workspace",
        "created_at",
        "found_at",  # issue 21: when it was found (a stall's is after when it happened)
        "data",
    }
    first = events[-1]  # the run created: Pending, "Run created"
    assert (first["kind"], first["state"], first["reason"]) == (
        "run.state",
        "Pending",
        "Run created",
    )
    assert first["workspace"] == "default"
    assert answer.json()["next_before"] is None
    # Every event of the workspace (L-44), two at a time.
    everything = (await client.get(EVENTS, headers=auth(tenancy.member_token))).json()["events"]
    assert {e["run"] for e in everything} == {"llama-sft", "sweep-7"}
    pages, before = [], None
    while True:
        params = {"limit": "2", **({"before": str(before)} if before else {})}
        page = (await client.get(EVENTS, params=params, headers=auth(tenancy.member_token))).json()
        pages += page["events"]
        before = page["next_before"]
        if before is None:
            break
    assert pages == everything
    # The same at /v1, and by kind.
    states = await client.get(
        "/v1/orgs/default/workspaces/default/events",
        params={"kind": "run.state"},
        headers=auth(tenancy.member_token),
    )
    assert states.json()["events"] and {e["kind"] for e in states.json()["events"]} == {"run.state"}


async def test_bad_limits_and_other_workspaces(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    await two_runs(db, clock, tenancy)
    for limit in ("0", "501", "fifty"):
        answer = await client.get(
            EVENTS, params={"limit": limit}, headers=auth(tenancy.member_token)
        )
        assert answer.status_code == 400
        assert answer.json()["errors"] == [
            {"field": "limit", "reason": "must be a whole number from 1 to 500"}
        ]
    before = await client.get(EVENTS, params={"before": "x"}, headers=auth(tenancy.member_token))
    assert before.json()["errors"][0]["field"] == "before"
    # Bob (team-b) and Carol (another organisation) see nothing of 'default'.
    bob = await client.get(EVENTS, headers=auth(tenancy.other_token))
    assert bob.status_code == 404 and bob.json()["code"] == "WORKSPACE_NOT_FOUND"
    assert "llama-sft" not in bob.text
    carol = await client.get(EVENTS, headers=auth(tenancy.foreign_token))
    assert carol.status_code == 404 and carol.json()["code"] == "ORGANIZATION_NOT_FOUND"
    # The organisation's admin sees every workspace of it; no one sees an unknown one.
    admin = await client.get(
        "/v1/orgs/default/workspaces/team-b/events", headers=auth(tenancy.admin_token)
    )
    assert admin.status_code == 200 and admin.json()["events"] == []
    nowhere = await client.get(
        "/v1/orgs/default/workspaces/nope/events", headers=auth(tenancy.admin_token)
    )
    assert nowhere.status_code == 404
