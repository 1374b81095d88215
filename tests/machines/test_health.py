"""Lemon machines (issue 23): the organisation's machines ranked by the GPU time lost on them,
with their workers' failures by kind, their GPU faults, their pool's median and the suggested
action; GraphQL machineHealth, for the organisation's admins only. Played through the real
lifecycle on a fake clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from backend.accounting.rules import Period
from backend.machines import health
from backend.machines import service as machines
from backend.machines.rules import FaultKind
from backend.models import Machine
from tests.lifecycle.world import World
from tests.support import Tenancy
from tests.support.accounting import sample, tick
from tests.support.api import graphql

T = datetime.fromisoformat("2026-10-01T00:00:00+00:00")
WEEK = Period(T, T + timedelta(days=7))
FIVE_TIMES = "drain: 5\u00d7 its pool's failures this week"
QUERY = """{ machineHealth { machines {
    machine pool lostGpuHours failureCount failures { kind count } faultCount
    gpuFaults { kind count } lastFault unhealthyGpus poolMedianFailures vsPool action
    lost { category gpuHours } } } }"""


def test_the_action_says_what_to_do() -> None:
    # the issue's own: "drain: 5\u00d7 its pool's failures this week"
    assert health.action(5, 1.0, 0, None, 0, 0.0, WEEK) == FIVE_TIMES
    assert health.action(3, 0.0, 0, None, 0, 0.0, WEEK) == (
        "drain: 3 failures this week, none on the rest of its pool"
    )
    assert health.action(3, 2.0, 0, None, 0, 7200.0, WEEK) == (
        "watch: 3 failures, 2.0 GPU-hours lost this week"
    )
    assert health.action(9, None, 0, None, 0, 0.0, WEEK).startswith("watch: 9 failures")
    assert health.action(0, 0.0, 2, "XID 79: the GPU reported a fatal error", 0, 0.0, WEEK) == (
        "drain: 2 GPU faults this week (XID 79: the GPU reported a fatal error)"
    )
    assert health.action(0, 0.0, 1, "ECC: 1 uncorrectable memory error(s)", 1, 0.0, WEEK) == (
        "drain: a GPU unhealthy now (ECC: 1 uncorrectable memory error(s))"
    )
    day = Period(T, T + timedelta(days=1))
    assert health.action(1, 0.0, 0, None, 0, 0.0, day) == (
        "watch: 1 failure, 0.0 GPU-hours lost in the period"
    )
    assert health.action(0, 0.0, 0, None, 0, 0.0, WEEK) == "none"


def test_a_failures_kind() -> None:
    assert health.failure_kind("exited", 1) == "program"
    assert health.failure_kind("exited", 137) == "signal"
    assert health.failure_kind("oom_killed", 137) == "out_of_memory"
    assert health.failure_kind("machine_lost", None) == "machine_lost"
    assert health.failure_kind("gpu_fault", None) == "gpu_fault"
    assert health.failure_kind("stalled", None) == "stalled"


async def fail_on(world: World, machine: str, name: str, *, minutes: int = 3) -> None:
    """A one-worker run of 8 GPUs placed on ``machine`` (the only one with room) that runs
    busy for some minutes and fails with exit code 1."""
    await world.submit(name=name, workers=1, gpus=8, restart_policy="never")
    await world.schedule()
    worker = f"{name}-0"
    assert (await world.workers(name))[0].machine_id == await machine_id(world, machine)
    await world.start(worker)
    for _ in range(minutes):
        await sample(world, {worker: 0.9})
        world.clock.advance(minutes=1)
        await tick(world)
    await world.report(worker, "exited", exit_code=1)


async def machine_id(world: World, name: str) -> int:
    async with world.db.read() as session:
        found = await session.scalar(select(Machine.id).where(Machine.name == name))
        assert found is not None
        return found


async def rows(client: httpx.AsyncClient, token: str) -> dict[str, dict[str, Any]]:
    body = await graphql(client, token, QUERY)
    assert "errors" not in body, body
    return {r["machine"]: r for r in body["data"]["machineHealth"]["machines"]}


async def hold(world: World, machine: str, name: str) -> None:
    """A run that keeps ``machine`` (the only one with room) busy from here on."""
    await world.submit(name=name, workers=1, gpus=8)
    await world.schedule()
    assert (await world.workers(name))[0].machine_id == await machine_id(world, machine)
    await world.start(f"{name}-0")


async def test_a_machine_whose_workers_keep_failing_tops_the_list(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # pool h100: gpu-07 fails five runs, gpu-08 and gpu-09 one each; gpu-10's GPU 3 reports
    # an XID. Each machine joins when the ones before are held, so each run lands where meant.
    await world.machine("gpu-07", pool="h100")
    for n in range(5):
        await fail_on(world, "gpu-07", f"bad-{n}")
    await hold(world, "gpu-07", "hold-7")
    await world.machine("gpu-08", pool="h100")
    await fail_on(world, "gpu-08", "once-8")
    await hold(world, "gpu-08", "hold-8")
    await world.machine("gpu-09", pool="h100")
    await fail_on(world, "gpu-09", "once-9")
    await hold(world, "gpu-09", "hold-9")
    await world.machine("gpu-10", pool="h100")
    async with world.db.transaction() as session:
        row = await session.get(Machine, await machine_id(world, "gpu-10"))
        assert row is not None
        xid = "XID 79: the GPU reported a fatal error"
        await machines.gpu_fault(session, world.clock, row, 3, xid, kind=FaultKind.XID)
        # the same fault said again is not another
        await machines.gpu_fault(session, world.clock, row, 3, xid, kind=FaultKind.XID)
    world.clock.advance(minutes=2)
    await tick(world)

    found = await rows(client, tenancy.admin_token)
    assert next(iter(found)) == "gpu-07"  # most failures, nothing lost more
    lemon = found["gpu-07"]
    assert lemon["failureCount"] == 5
    assert lemon["failures"] == [{"kind": "program", "count": 5}]
    assert lemon["poolMedianFailures"] == 1.0 and lemon["vsPool"] == 5.0
    assert lemon["action"] == FIVE_TIMES
    assert found["gpu-08"]["action"].startswith("watch: 1 failure, ")
    assert found["gpu-08"]["poolMedianFailures"] == 1.0  # gpu-07's 5, gpu-09's 1, gpu-10's 0
    faulty = found["gpu-10"]
    assert (faulty["faultCount"], faulty["gpuFaults"]) == (1, [{"kind": "xid", "count": 1}])
    assert faulty["unhealthyGpus"] == 1
    assert faulty["action"] == "drain: a GPU unhealthy now (XID 79: the GPU reported a fatal error)"
    # lost: each machine's held failure, restart and stalled time, as its ledger says
    report = await graphql(
        client,
        tenancy.admin_token,
        "{ goodput(by: MACHINE) { rows { name ledger { gpuHours { category heldGpuHours } } } } }",
    )
    for r in report["data"]["goodput"]["rows"]:
        held = {c["category"]: c["heldGpuHours"] for c in r["ledger"]["gpuHours"]}
        expected = sum(held[c] for c in ("failure", "restart", "stalled"))
        assert found[r["name"]]["lostGpuHours"] == pytest.approx(expected, abs=1e-9)


async def test_only_the_organisations_admins_see_its_machines_health(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # another workspace's failures on a machine are not a member's to count
    await world.machine("gpu-07", pool="h100")
    await fail_on(world, "gpu-07", "bad-0")
    for token in (tenancy.member_token, tenancy.other_token):
        body = await graphql(client, token, QUERY)
        assert body["data"] is None or body["data"].get("machineHealth") is None
        assert body["errors"][0]["extensions"]["code"] == "FORBIDDEN", body
    # an admin of another organisation is a member of its own here: refused too, and its
    # organisation's (no machines) is empty for its admin
    body = await graphql(client, tenancy.foreign_token, QUERY)
    assert body["errors"][0]["extensions"]["code"] == "FORBIDDEN", body
    assert list(await rows(client, tenancy.admin_token)) == ["gpu-07"]
