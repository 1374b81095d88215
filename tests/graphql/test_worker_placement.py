"""An ended worker keeps saying where it ran (issue 21: its page showed Machine "—" and GPU ids
"—"): Worker.lastPlacement, and How it was started's GPU ids, after its end; seed L-27, L-28."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy

QUERY = """query($name: String!) { run(name: $name) { workers {
  name state machine gpuIds lastPlacement { machine gpuIds } started { gpuIds } } } }"""


async def workers(client: httpx.AsyncClient, token: str, run: str) -> list[dict[str, Any]]:
    answer = await client.post(
        "/graphql",
        json={"query": QUERY, "variables": {"name": run}},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert "errors" not in body, body
    return list(body["data"]["run"]["workers"])


@pytest.fixture
async def world(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=4)
    return world


async def test_an_ended_worker_keeps_its_machine_and_gpu_ids(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await world.submit(name="short", workers=2, gpus=2)
    [before, _] = await workers(client, tenancy.member_token, "short")
    assert before["lastPlacement"] is None  # not placed yet
    assert before["started"]["gpuIds"] == []
    await world.schedule()
    await world.start("short-0", "short-1")
    placed = await workers(client, tenancy.member_token, "short")
    now = {w["name"]: (w["machine"], w["gpuIds"]) for w in placed}
    assert {w["name"]: w["lastPlacement"] for w in placed} == {
        name: {"machine": machine, "gpuIds": gpu_ids} for name, (machine, gpu_ids) in now.items()
    }
    assert sorted(g for _, ids in now.values() for g in ids) == [0, 1, 2, 3]
    world.clock.advance(seconds=5)
    await world.report("short-0", "exited", exit_code=0)
    await world.report("short-1", "exited", exit_code=0)
    ended = await workers(client, tenancy.member_token, "short")
    for w in ended:
        assert w["state"] == "Completed"
        # it holds nothing now ...
        assert (w["machine"], w["gpuIds"]) == (None, [])
        # ... and says where it ran
        machine, gpu_ids = now[w["name"]]
        assert w["lastPlacement"] == {"machine": machine, "gpuIds": gpu_ids}
        assert w["started"]["gpuIds"] == gpu_ids
