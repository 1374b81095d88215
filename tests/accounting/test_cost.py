"""Cost (issue 23): an hourly price per GPU per pool, set by the organisation's admins (none by
default), turns GPU-hours into money: each held interval's GPU-hours times its pool's price, by
workspace and run, in REST (/goodput/cost) and GraphQL (goodputCost). Checked by hand on the
seed's week against its ledger, and the price's validation and access."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.accounting.seed_week import play_seed_week
from tests.lifecycle.world import World
from tests.support import Tenancy
from tests.support.api import get, graphql

PRICE = """mutation($c: String!, $p: String!, $price: Float, $cur: String!) {
  setPoolPrice(cluster: $c, pool: $p, pricePerGpuHour: $price, currency: $cur) {
    price { cluster pool pricePerGpuHour currency } errors { code message field } } }"""
COST = """query($by: CostScope!) { goodputCost(by: $by) { currency
  rows { name held lost byCategory { category amount } } total { held lost } } }"""
HELD = ("productive", "idle", "stalled", "starting", "restart", "failure", "preemption")


async def set_price(
    client: httpx.AsyncClient, token: str, price: float | None, currency: str = "USD", **where: str
) -> dict[str, Any]:
    body = await graphql(
        client,
        token,
        PRICE,
        c=where.get("cluster", "local"),
        p=where.get("pool", "h100"),
        price=price,
        cur=currency,
    )
    assert "errors" not in body, body
    return dict(body["data"]["setPoolPrice"])


async def test_the_seed_weeks_cost_by_hand(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await play_seed_week(world)
    # no price: no cost
    none = (await get(client, tenancy.member_token, "/goodput/cost", by="run")).json()
    assert none["currency"] is None and none["ledgers"] == [] and none["total"]["held_cost"] == 0
    done = await set_price(client, tenancy.admin_token, 2.5)
    assert done == {
        "price": {"cluster": "local", "pool": "h100", "pricePerGpuHour": 2.5, "currency": "USD"},
        "errors": [],
    }
    # both runs ran on h100's machines: each held category's GPU-hours times 2.5
    report = (await get(client, tenancy.member_token, "/goodput", by="run")).json()
    cost = (await get(client, tenancy.member_token, "/goodput/cost", by="run")).json()
    assert cost["currency"] == "USD"
    ledgers = {r["name"]: r for r in report["ledgers"]}
    assert [r["name"] for r in cost["ledgers"]] == ["llm", "sweep-7"]
    for row in cost["ledgers"]:
        held = ledgers[row["name"]]["held_gpu_hours"]
        for category in HELD:
            assert row["cost"][category] == pytest.approx(held[category] * 2.5, abs=1e-9)
        assert row["held_cost"] == pytest.approx(ledgers[row["name"]]["allocated_gpu_hours"] * 2.5)
        lost = sum(held[c] for c in HELD if c != "productive") * 2.5
        assert row["lost_cost"] == pytest.approx(lost)
    llm = next(r for r in cost["ledgers"] if r["name"] == "llm")
    assert llm["cost"]["stalled"] > 0 and llm["cost"]["failure"] > 0
    sweep = next(r for r in cost["ledgers"] if r["name"] == "sweep-7")
    assert sweep["cost"]["idle"] > 0
    # by workspace: the same money, summed; GraphQL says the same
    workspace = (await get(client, tenancy.member_token, "/goodput/cost")).json()
    assert workspace["ledgers"][0]["name"] == "default"
    assert workspace["total"]["held_cost"] == pytest.approx(cost["total"]["held_cost"])
    body = await graphql(client, tenancy.member_token, COST, by="RUN")
    ours = body["data"]["goodputCost"]
    assert ours["currency"] == "USD"
    for theirs, mine in zip(cost["ledgers"], ours["rows"], strict=True):
        assert mine["name"] == theirs["name"]
        assert mine["held"] == pytest.approx(theirs["held_cost"])
        assert mine["lost"] == pytest.approx(theirs["lost_cost"])
        shown = {c["category"]: c["amount"] for c in mine["byCategory"]}
        assert shown == pytest.approx(theirs["cost"])
    # another workspace's member sees its own workspace's (nothing), never default's
    theirs = (await get(client, tenancy.other_token, "/goodput/cost", by="run")).json()
    assert theirs["ledgers"] == []
    refused = await get(client, tenancy.other_token, "/goodput/cost", workspace="default")
    assert refused.status_code in (403, 404), refused.text
    # a price taken away: no cost again
    await set_price(client, tenancy.admin_token, None)
    again = (await get(client, tenancy.member_token, "/goodput/cost", by="run")).json()
    assert again["currency"] is None and again["ledgers"] == []


async def test_a_price_is_checked_and_set_by_admins_only(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await world.machine("gpu-07", pool="h100")
    await world.machine("gpu-09", pool="a100")
    member = await graphql(
        client, tenancy.member_token, PRICE, c="local", p="h100", price=2.0, cur="USD"
    )
    assert member["data"]["setPoolPrice"]["errors"][0]["code"] == "FORBIDDEN", member
    bad = await set_price(client, tenancy.admin_token, -1.0, currency="usd")
    fields = {e["field"]: e["message"] for e in bad["errors"]}
    assert fields == {
        "pricePerGpuHour": "must be from 0 to 1,000,000",
        "currency": "must be an ISO 4217 code of 3 capital letters",
    }
    gone = await set_price(client, tenancy.admin_token, 2.0, pool="v100")
    assert gone["errors"][0]["code"] == "POOL_NOT_FOUND"
    assert (await set_price(client, tenancy.admin_token, 2.0))["errors"] == []
    # one currency for the organisation: every cost adds up in one
    other = await set_price(client, tenancy.admin_token, 1.0, currency="EUR", pool="a100")
    assert other["errors"] == [
        {
            "code": "INVALID_PRICE",
            "field": "currency",
            "message": "must be USD, the currency of the organisation's other priced pools: "
            "every cost adds up in one",
        }
    ]
    # another organisation's admin does not see this organisation's cluster
    foreign = await graphql(
        client, tenancy.foreign_token, PRICE, c="local", p="h100", price=9.0, cur="USD"
    )
    assert foreign["data"]["setPoolPrice"]["errors"][0]["code"] in (
        "FORBIDDEN",
        "CLUSTER_NOT_FOUND",
    )
    pools = await graphql(
        client, tenancy.admin_token, "{ pools { name pricePerGpuHour currency } }"
    )
    assert {p["name"]: (p["pricePerGpuHour"], p["currency"]) for p in pools["data"]["pools"]} == {
        "a100": (None, None),
        "h100": (2.0, "USD"),
    }
