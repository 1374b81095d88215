"""`gpus`: every GPU the workspace can see, its utilisation, health and holder (seed L-39)."""

from __future__ import annotations

import httpx

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.accounting import sample
from tests.support.api import graphql

QUERY = "{ gpus { machine index model health utilization heldBy heldElsewhere line } }"


async def test_each_gpu_as_the_seed_lists_it(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=2)
    await world.submit(workers=1, gpus=2)  # llama-sft holds both GPUs of gpu-07
    await world.schedule()
    await world.start("llama-sft-0")
    await world.machine("gpu-08", gpus=1)
    await world.submit(tenancy.other_token, name="theirs", workers=1, gpus=1)  # team-b's
    await world.schedule()
    await world.machine("gpu-09", gpus=1)
    await sample(world, {"llama-sft-0": 0.97})
    body = await graphql(client, tenancy.member_token, QUERY)
    assert "errors" not in body, body
    lines = [g["line"] for g in body["data"]["gpus"]]
    assert lines == [
        "gpu-07/0  NVIDIA H100 80GB HBM3  97%  ok  held by llama-sft",
        "gpu-07/1  NVIDIA H100 80GB HBM3  97%  ok  held by llama-sft",
        "gpu-08/0  NVIDIA H100 80GB HBM3  —  ok  held by another workspace",
        "gpu-09/0  NVIDIA H100 80GB HBM3  0%  ok  free",
    ]
    theirs = await graphql(client, tenancy.other_token, QUERY)
    seen = {(g["machine"], g["index"]): g for g in theirs["data"]["gpus"]}
    assert seen[("gpu-08", 0)]["heldBy"] == "theirs"
    assert seen[("gpu-07", 0)]["heldElsewhere"] and seen[("gpu-07", 0)]["heldBy"] is None
    assert seen[("gpu-07", 0)]["utilization"] is None  # nothing of another workspace's work
    foreign = await graphql(client, tenancy.foreign_token, QUERY)
    assert foreign["data"]["gpus"] == []  # another organisation's machines: none of these


async def test_machines_are_the_organisation_admins(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=2, pool="a100")
    await world.machine("gpu-08", gpus=1)
    query = "{ machines { name cluster pool state reason gpus unhealthyGpus lastSeenAt } }"
    admin = await graphql(client, tenancy.admin_token, query)
    assert [
        (m["name"], m["cluster"], m["pool"], m["state"], m["gpus"])
        for m in admin["data"]["machines"]
    ] == [("gpu-07", "local", "a100", "ready", 2), ("gpu-08", "local", None, "ready", 1)]
    pools = await graphql(client, tenancy.admin_token, "{ pools { name cluster machines gpus } }")
    assert pools["data"]["pools"] == [
        {"name": "a100", "cluster": "local", "machines": 1, "gpus": 2}
    ]
    for outsider in (tenancy.member_token, tenancy.foreign_token):
        refused = await graphql(client, outsider, query)
        assert refused["data"] is None
        assert refused["errors"][0]["message"].startswith("Only the organisation's admins")
