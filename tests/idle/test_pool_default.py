"""A pool's default idle policy (issue 41): set by the organisation's admins through GraphQL,
checked as a run's own, taken at submission by a run of the pool that has none of its own (as a
Kubernetes LimitRange's default); a run with its own keeps it, one without GPUs takes none, and
nobody of another workspace or organisation changes it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.lifecycle.world import World
from tests.support import Tenancy
from tests.support.api import graphql

pytestmark = pytest.mark.db

SET = """mutation($c: String!, $p: String!, $idle: JSON) {
  setPoolIdlePolicy(cluster: $c, pool: $p, idle: $idle) {
    pool { cluster pool idlePolicy { gpuUtilizationBelow window action } }
    errors { code field message } } }"""
RUN = """query($n: String!) {
  run(name: $n) { spec idlePolicy { gpuUtilizationBelow window action } } }"""
POOLS = "{ pools { name idlePolicy { window action } } }"


async def set_default(
    client: httpx.AsyncClient, token: str, idle: Any, pool: str = "h100"
) -> dict[str, Any]:
    body = await graphql(client, token, SET, c="local", p=pool, idle=idle)
    assert "errors" not in body, body
    return dict(body["data"]["setPoolIdlePolicy"])


async def policy_of(client: httpx.AsyncClient, tenancy: Tenancy, run: str) -> Any:
    body = await graphql(client, tenancy.member_token, RUN, n=run)
    return body["data"]["run"]["idlePolicy"]


async def test_a_pools_default_is_taken_by_its_runs_without_their_own(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await world.machine("gpu-07", pool="h100")
    await world.machine("gpu-09", pool="a100")
    await world.submit(name="before", pool="h100", gpus=1)  # before the default: none
    done = await set_default(client, tenancy.admin_token, {"for": "2h", "action": "notify"})
    assert done == {
        "pool": {
            "cluster": "local",
            "pool": "h100",
            "idlePolicy": {"gpuUtilizationBelow": 5.0, "window": "2h", "action": "notify"},
        },
        "errors": [],
    }
    await world.submit(name="notebook", pool="h100", gpus=1)
    await world.submit(name="own", pool="h100", gpus=1, idle={"for": "10m"})
    await world.submit(name="cpu-only", pool="h100", gpus=0)
    await world.submit(name="elsewhere", pool="a100", gpus=1)
    assert await policy_of(client, tenancy, "notebook") == {
        "gpuUtilizationBelow": 5.0,
        "window": "2h",
        "action": "notify",
    }
    assert (await world.run("notebook")).idle_policy == {
        "gpu_utilization_below": 5.0,
        "for": "2h",
        "action": "notify",
    }
    assert (await policy_of(client, tenancy, "own"))["window"] == "10m"
    for none in ("before", "cpu-only", "elsewhere"):
        assert await policy_of(client, tenancy, none) is None, none
        assert (await world.run(none)).idle_policy is None
    pools = (await graphql(client, tenancy.admin_token, POOLS))["data"]["pools"]
    assert {p["name"]: p["idlePolicy"] for p in pools} == {
        "a100": None,
        "h100": {"window": "2h", "action": "notify"},
    }
    # taken away: the runs submitted since have none; those before keep theirs
    assert (await set_default(client, tenancy.admin_token, None))["pool"]["idlePolicy"] is None
    await world.submit(name="after", pool="h100", gpus=1)
    assert await policy_of(client, tenancy, "after") is None
    assert (await policy_of(client, tenancy, "notebook"))["window"] == "2h"


async def test_a_pools_default_is_checked_and_set_by_its_admins_only(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await world.machine("gpu-07", pool="h100")
    bad = await set_default(client, tenancy.admin_token, {"for": "90s", "action": "kill"})
    assert bad["pool"] is None
    assert {(e["code"], e["field"], e["message"]) for e in bad["errors"]} == {
        (
            "INVALID_IDLE_POLICY",
            "idle.for",
            "must be whole minutes: utilization is measured minute by minute",
        ),
        ("INVALID_IDLE_POLICY", "idle.action", "must be one of 'stop' or 'notify'"),
    }
    gone = await set_default(client, tenancy.admin_token, {"for": "1h"}, pool="v100")
    assert [e["code"] for e in gone["errors"]] == ["POOL_NOT_FOUND"]
    for token in (tenancy.member_token, tenancy.other_token):
        refused = await set_default(client, token, {"for": "1m"})
        assert [e["code"] for e in refused["errors"]] == ["FORBIDDEN"], refused
    # another organisation's admin names our pool: their organisation has no such pool
    outsider = await set_default(client, tenancy.foreign_token, {"for": "1m"})
    assert [e["code"] for e in outsider["errors"]] in (["FORBIDDEN"], ["NOT_FOUND"]), outsider
    await world.submit(name="notebook", pool="h100", gpus=1)
    assert (await world.run("notebook")).idle_policy is None  # nothing was set
