"""GraphQL reads of what happened: the workspace's events, a worker's history, a metric's
series; the same answers as the REST shim, nothing of another workspace (issue 6)."""

from __future__ import annotations

import httpx
import pytest

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.accounting import sample
from tests.support.api import graphql


@pytest.fixture
async def running(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=2)
    await world.schedule()
    await world.start("llama-sft-0")
    for busy in (0.5, 0.9):
        clock.advance(seconds=30)
        await sample(world, {0: busy})
    return world


async def test_events_and_a_workers_history(
    client: httpx.AsyncClient,
    running: World,
    tenancy: Tenancy,
) -> None:
    # seed L-43 (a worker's transitions, newest first), L-44/L-46 (the workspace's events)
    query = """{ events(name: "llama-sft", limit: 3) { events { id kind state reason run }
      nextBefore }
      run(name: "llama-sft") { workers { history { state reason } } } }"""
    data = (await graphql(client, tenancy.member_token, query))["data"]
    rest = (
        await client.get(
            "/v1/orgs/default/workspaces/default/events",
            params={"name": "llama-sft", "limit": "3"},
            headers={"Authorization": f"Bearer {tenancy.member_token}"},
        )
    ).json()
    assert [e["id"] for e in data["events"]["events"]] == [e["id"] for e in rest["events"]]
    assert data["events"]["nextBefore"] == rest["next_before"]
    history = data["run"]["workers"][0]["history"]
    assert history[0]["state"] == "Running" and history[-1]["state"] == "Pending"
    refused = await graphql(client, tenancy.member_token, "{ events(limit: 0) { nextBefore } }")
    assert "limit" in refused["errors"][0]["message"]
    peek = await graphql(
        client, tenancy.other_token, '{ events(workspace: "default") { nextBefore } }'
    )
    assert peek["data"] is None and "llama-sft" not in str(peek)
    own = await graphql(client, tenancy.other_token, "{ events { events { run } } }")
    assert own["data"]["events"]["events"] == []


async def test_a_metric_series_equals_the_rest_shims(
    client: httpx.AsyncClient,
    running: World,
    tenancy: Tenancy,
) -> None:
    # seed L-40: match task:<worker>, by gpu, agg max
    params = {
        "metric": "task_gpu_utilization_ratio",
        "match": "task:llama-sft-0",
        "by": "gpu",
        "agg": "max",
    }
    rest = (
        await client.get(
            "/v1/metrics/range",
            params=params,
            headers={"Authorization": f"Bearer {tenancy.member_token}"},
        )
    ).json()
    query = """{ metricRange(metric: "task_gpu_utilization_ratio", match: ["task:llama-sft-0"],
      by: "gpu", agg: "max") { metric kind unit start end step series { labels points } } }"""
    mine = (await graphql(client, tenancy.member_token, query))["data"]["metricRange"]
    assert (mine["metric"], mine["kind"], mine["unit"]) == (
        rest["metric"],
        rest["kind"],
        rest["unit"],
    )
    assert (mine["start"], mine["end"], mine["step"]) == (rest["start"], rest["end"], rest["step"])
    assert [s["labels"] for s in mine["series"]] == [s["labels"] for s in rest["series"]]
    assert [s["points"] for s in mine["series"]] == [s["points"] for s in rest["series"]]
    assert len(mine["series"]) == 2 and mine["series"][0]["points"]
    bad = await graphql(client, tenancy.member_token, '{ metricRange(metric: "nope") { unit } }')
    assert "metric" in bad["errors"][0]["message"]
    outsider = await graphql(client, tenancy.other_token, query)
    assert outsider["data"] is None
    assert outsider["errors"][0]["message"] == (
        "No worker named 'llama-sft-0' in workspace 'team-b'."
    )


async def test_how_a_worker_was_started(
    client: httpx.AsyncClient,
    running: World,
    tenancy: Tenancy,
) -> None:
    # seed L-28: image, command, user, GPU ids, restart policy, time limit, rank, environment,
    # mounts
    query = """{ run(name: "llama-sft") { workers { started { image command user gpuIds
      restartPolicy timeLimit rank environment mounts } } } }"""
    started = (await graphql(client, tenancy.member_token, query))["data"]["run"]["workers"][0][
        "started"
    ]
    assert started["command"] == ["python", "train.py"]
    assert started["gpuIds"] == [0, 1] and started["rank"] == 0
    assert started["restartPolicy"] == "on_failure"
    assert started["environment"] == {} and started["mounts"] == []
