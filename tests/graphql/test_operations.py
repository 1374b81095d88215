"""Run again, drain a machine, set a threshold, and the alerts firing, in GraphQL (issue 6):
each refused to those who may not, with a reason naming the field."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from backend.alerts import service as alerts
from backend.db import Database
from backend.machines import service as machines
from backend.machines.rules import FaultKind
from backend.models import Machine, Run
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import graphql
from tests.support.lifecycle import running_gang

AGAIN = """mutation($name: String!, $new: String!) { runAgain(name: $name, newName: $new) {
  run { name spec } errors { code field message } } }"""
DRAIN = """mutation($m: String!) { drainMachine(cluster: "local", machine: $m) {
  machine { name state reason } errors { code message } } }"""
THRESHOLD = """mutation($n: String!, $v: Float!) { setThreshold(cluster: "local", name: $n,
  value: $v) { threshold { name value } errors { code field message } } }"""


async def test_run_again_under_a_new_name(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.submit(workers=2, gpus=4)
    again = await graphql(client, tenancy.member_token, AGAIN, name="llama-sft", new="llama-2")
    created = again["data"]["runAgain"]
    assert created["errors"] == [] and created["run"]["name"] == "llama-2"
    async with db.read() as session:
        specs = {r.name: r.spec for r in await session.scalars(select(Run))}
    assert {k: v for k, v in specs["llama-2"].items() if k != "name"} == {
        k: v for k, v in specs["llama-sft"].items() if k != "name"
    }
    taken = await graphql(client, tenancy.member_token, AGAIN, name="llama-sft", new="llama-2")
    assert taken["data"]["runAgain"]["run"] is None
    assert taken["data"]["runAgain"]["errors"][0]["code"] == "RUN_EXISTS"
    theirs = await graphql(client, tenancy.other_token, AGAIN, name="llama-sft", new="mine")
    assert theirs["data"]["runAgain"]["errors"][0]["code"] == "JOB_NOT_FOUND"


async def test_an_admin_drains_a_machine_and_its_runs_move(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=8)
    await world.schedule()
    await world.start("llama-sft-0")
    for outsider in (tenancy.member_token, tenancy.foreign_token):
        refused = await graphql(client, outsider, DRAIN, m="gpu-07")
        assert refused["data"]["drainMachine"]["errors"][0]["code"] == "MACHINE_NOT_FOUND"
    drained = await graphql(client, tenancy.admin_token, DRAIN, m="gpu-07")
    assert drained["data"]["drainMachine"] == {
        "machine": {"name": "gpu-07", "state": "draining", "reason": "Drained by an operator"},
        "errors": [],
    }
    run = await world.run("llama-sft")
    assert run.reason == "Preempted by a drain of gpu-07"  # it winds down, then waits again
    unknown = await graphql(client, tenancy.admin_token, DRAIN, m="gpu-99")
    assert unknown["data"]["drainMachine"]["errors"][0]["code"] == "MACHINE_NOT_FOUND"


async def test_thresholds_and_the_alerts_firing(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    refused = await graphql(client, tenancy.member_token, THRESHOLD, n="gpu_faults", v=0)
    assert refused["data"]["setThreshold"]["errors"][0]["code"] == "FORBIDDEN"  # issue 21
    bad = await graphql(client, tenancy.admin_token, THRESHOLD, n="nope", v=1)
    assert bad["data"]["setThreshold"]["errors"][0]["field"] == "name"
    ok = await graphql(client, tenancy.admin_token, THRESHOLD, n="gpu_faults", v=1)
    assert ok["data"]["setThreshold"] == {
        "threshold": {"name": "gpu_faults", "value": 1.0},
        "errors": [],
    }
    async with db.transaction() as session:
        gpu07 = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
        assert gpu07 is not None
        await machines.gpu_fault(
            session, clock, gpu07, 3, "XID 79: the GPU fell off the bus", kind=FaultKind.XID
        )
    async with db.transaction() as session:  # the next evaluation, as the job runs it
        await alerts.evaluate(session, clock)
    query = "{ alertsFiring { metric subject value threshold reason } }"
    admin = (await graphql(client, tenancy.admin_token, query))["data"]["alertsFiring"]
    assert [(a["metric"], a["value"], a["threshold"]) for a in admin] == [("gpu_faults", 1, 1)]
    member = (await graphql(client, tenancy.member_token, query))["data"]["alertsFiring"]
    assert member == []  # a cluster's alert is its operators'
    foreign = (await graphql(client, tenancy.foreign_token, query))["data"]["alertsFiring"]
    assert foreign == []


async def test_workers_stalled_and_stragglers_now(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # seed G-22: "Workers stalled and stragglers now … are listed first": the attention list
    world = World(db, clock, tenancy)
    await running_gang(world, workers=3, gpus=2)
    await world.submit(name="quiet", workers=1, gpus=1, stall_timeout="5m", on_stall="keep")
    await world.machine("gpu-09")
    await world.schedule()
    await world.start("quiet-0")
    paces = {0: 100, 1: 100, 2: 20}  # llama-sft-2 is well behind; quiet-0 never progresses
    for minute in range(1, 7):
        clock.advance(minutes=1)
        for rank, pace in paces.items():
            await world.report(f"llama-sft-{rank}", "progress", step=minute * pace)
        await world.timers()
    query = "{ attention { run worker kind since reason machine } }"
    found = (await graphql(client, tenancy.member_token, query))["data"]["attention"]
    assert [(a["worker"], a["kind"]) for a in found] == [
        ("quiet-0", "stalled"),
        ("llama-sft-2", "straggler"),
    ]
    assert found[0]["reason"].startswith("Stalled: no progress for")
    assert found[1]["machine"] is not None
    theirs = (await graphql(client, tenancy.other_token, query))["data"]["attention"]
    assert theirs == []
