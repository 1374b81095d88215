"""Goodput in GraphQL: the same ledgers as the REST shim, the intervals behind a figure, a
run's own ledger, and who sees what (seed G-27 … G-31; issue 6)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import event

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import Tenancy
from tests.support.accounting import tick
from tests.support.api import get, graphql

REPORT = """query($by: GoodputScope!, $workspace: String) {
  goodput(by: $by, workspace: $workspace) {
    by start end
    rows { name ledger { allocatedGpuHours productiveGpuHours lostGpuHours waitingGpuHours
      goodput gpuHours { category gpuHours heldGpuHours } biggestLoss { category gpuHours } } }
    total { allocatedGpuHours productiveGpuHours goodput }
  }
}"""


async def test_the_report_equals_the_rest_shims(
    client: httpx.AsyncClient,
    week: World,
    tenancy: Tenancy,
) -> None:
    for by in ("RUN", "MACHINE", "WORKSPACE", "POOL"):
        body = await graphql(client, tenancy.member_token, REPORT, by=by)
        assert "errors" not in body, body
        report = body["data"]["goodput"]
        rest = (await get(client, tenancy.member_token, "/goodput", by=by.lower())).json()
        assert report["by"] == by
        assert [r["name"] for r in report["rows"]] == [r["name"] for r in rest["ledgers"]]
        for mine, theirs in zip(report["rows"], rest["ledgers"], strict=True):
            ledger = mine["ledger"]
            assert ledger["allocatedGpuHours"] == pytest.approx(theirs["allocated_gpu_hours"])
            assert ledger["productiveGpuHours"] == pytest.approx(theirs["productive_gpu_hours"])
            assert ledger["lostGpuHours"] == pytest.approx(theirs["lost_gpu_hours"])
            assert ledger["waitingGpuHours"] == pytest.approx(theirs["waiting_gpu_hours"])
            assert ledger["goodput"] == pytest.approx(theirs.get("goodput"))
            hours = {c["category"]: c["gpuHours"] for c in ledger["gpuHours"]}
            assert hours == pytest.approx(theirs["gpu_hours"])
        assert report["total"]["allocatedGpuHours"] == pytest.approx(
            rest["total"]["allocated_gpu_hours"]
        )
    runs = (await graphql(client, tenancy.member_token, REPORT, by="RUN"))["data"]["goodput"]
    sweep = next(r for r in runs["rows"] if r["name"] == "sweep-7")["ledger"]
    # sweep-7 was busy once placed: its ten minutes waiting for a machine are its biggest loss.
    assert sweep["biggestLoss"] == {"category": "waiting", "gpuHours": pytest.approx(4 * 10 / 60)}


async def test_a_runs_ledger_weeks_and_the_intervals_behind_a_figure(
    client: httpx.AsyncClient,
    week: World,
    tenancy: Tenancy,
) -> None:
    query = """{ run(name: "llm") { goodput { allocatedGpuHours productiveGpuHours } }
      runs { name goodput { allocatedGpuHours } }
      goodputWeekly(by: RUN, weeks: 8) { week report { rows { name } total { allocatedGpuHours } } }
      goodputIntervals(by: RUN, name: "sweep-7", category: "waiting") {
        worker run machine start end category held gpus gpuHours } }"""
    data = (await graphql(client, tenancy.member_token, query))["data"]
    rest = (await get(client, tenancy.member_token, "/runs/llm/goodput")).json()
    assert data["run"]["goodput"]["allocatedGpuHours"] == pytest.approx(rest["allocated_gpu_hours"])
    assert {r["name"] for r in data["runs"]} == {"llm", "sweep-7"}
    weeks = data["goodputWeekly"]
    assert len(weeks) == 8 and weeks[-1]["week"] == "2026-W40"
    assert {r["name"] for r in weeks[-1]["report"]["rows"]} == {"llm", "sweep-7"}
    waits = data["goodputIntervals"]
    assert [(i["worker"], i["category"], i["held"], i["machine"]) for i in waits] == [
        ("sweep-7-0", "waiting", False, None)
    ]
    assert waits[0]["gpuHours"] == pytest.approx(4 * 10 / 60)


async def test_bad_input_is_named_and_other_workspaces_see_nothing(
    client: httpx.AsyncClient,
    week: World,
    tenancy: Tenancy,
) -> None:
    weeks = await graphql(client, tenancy.member_token, "{ goodputWeekly(weeks: 0) { week } }")
    assert "weeks" in weeks["errors"][0]["message"]
    limit = await graphql(
        client,
        tenancy.member_token,
        '{ goodputIntervals(by: RUN, name: "llm", limit: 0) { worker } }',
    )
    assert "limit" in limit["errors"][0]["message"]
    period = await graphql(
        client,
        tenancy.member_token,
        '{ goodput(by: RUN, start: "2026-10-01T00:00:00Z", end: "2025-01-01T00:00:00Z") '
        "{ rows { name } } }",
    )
    assert "end" in period["errors"][0]["message"]
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        theirs = await graphql(client, outsider, REPORT, by="RUN")
        assert theirs["data"]["goodput"]["rows"] == []
        peek = await graphql(client, outsider, REPORT, by="RUN", workspace="default")
        assert "llm" not in str(peek)  # Bob is refused; Carol's own 'default' is empty
        if outsider == tenancy.other_token:
            assert peek["data"] is None and "default" in peek["errors"][0]["message"]
        hidden = await graphql(
            client, outsider, '{ goodputIntervals(by: RUN, name: "llm") { worker } }'
        )
        assert "llm-0" not in str(hidden)


async def test_a_reports_rows_come_a_page_at_a_time(
    client: httpx.AsyncClient,
    week: World,
    tenancy: Tenancy,
) -> None:
    query = """{ goodput(by: RUN) { rowCount all: rows { name } second: rows(first: 1, offset: 1)
      { name } total { allocatedGpuHours } } }"""
    report = (await graphql(client, tenancy.member_token, query))["data"]["goodput"]
    assert report["rowCount"] == 2
    assert report["second"] == report["all"][1:]
    refused = await graphql(
        client, tenancy.member_token, "{ goodput { rows(first: -1) { name } } }"
    )
    assert "first" in refused["errors"][0]["message"]


async def test_the_goodput_page_takes_a_fixed_number_of_statements(
    client: httpx.AsyncClient,
    world: World,
    tenancy: Tenancy,
    db: Database,
) -> None:
    # issue 6: DataLoaders everywhere; the console's goodput page, locked
    page = """{ goodput(by: RUN) { rowCount rows { name ledger { goodput biggestLoss { category } }
      } total { goodput } } attention { worker machine } alertsFiring { subject } gpus { line } }"""

    async def statements() -> int:
        seen: list[str] = []

        def count(*args: Any) -> None:
            seen.append(args[2])

        event.listen(db.engine.sync_engine, "before_cursor_execute", count)
        try:
            body = await graphql(client, tenancy.member_token, page)
        finally:
            event.remove(db.engine.sync_engine, "before_cursor_execute", count)
        assert "errors" not in body, body
        return len([s for s in seen if s.lstrip().upper().startswith(("SELECT", "WITH"))])

    await world.machine("gpu-07")
    for i in range(2):
        await world.submit(name=f"r{i}", workers=1, gpus=1)
    await world.schedule()
    world.clock.advance(minutes=2)
    await tick(world)
    few = await statements()
    for i in range(2, 6):
        await world.submit(name=f"r{i}", workers=1, gpus=1)
    await world.schedule()
    world.clock.advance(minutes=2)
    await tick(world)
    assert await statements() == few  # six runs' rows cost what two did
    rows = await graphql(client, tenancy.member_token, "{ goodput(by: RUN) { rowCount } }")
    assert rows["data"]["goodput"]["rowCount"] == 6
