"""The ledgers' sums: the same time in every scope, by the hour and by the week (seed G-18), and
GPU time only (seed G-17), through the REST shim over the real services on a fake clock."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from backend.accounting import counting
from tests.accounting.seed_week import minutes, play_seed_week
from tests.lifecycle.world import World
from tests.support import SEED_TIME, Tenancy
from tests.support.api import get

FIGURES = ("allocated_gpu_hours", "productive_gpu_hours", "waiting_gpu_hours", "lost_gpu_hours")
SCOPES = ("run", "machine", "pool", "workspace")


def figures(ledger: dict[str, Any]) -> dict[str, float]:
    return {f: round(ledger[f], 9) for f in FIGURES} | {
        f"held {c}": round(v, 9) for c, v in ledger["held_gpu_hours"].items()
    }


async def test_every_scope_sums_the_same_time_by_the_hour_and_by_the_week(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # seed G-18: sums per run, machine, pool and workspace, by the hour and by the week. The
    # seed's week of llm and sweep-7 on two machines of pool h100: each scope's rows add up to
    # the same held time (a machine's and a pool's are what was held on them: no waits), the
    # hour by hour series adds up to the period's, and the week's (2026-W40) to the same.
    await play_seed_week(world)
    token = tenancy.member_token
    start = SEED_TIME.replace(minute=0, second=0, microsecond=0)
    reports = {
        by: (await get(client, token, "/goodput", by=by, start=start.isoformat())).json()
        for by in SCOPES
    }
    names = {by: [r["name"] for r in report["ledgers"]] for by, report in reports.items()}
    assert names == {
        "run": ["llm", "sweep-7"],
        "machine": ["gpu-07", "gpu-08"],
        "pool": ["h100"],
        "workspace": ["default"],
    }
    totals = {by: figures(report["total"]) for by, report in reports.items()}
    for by, report in reports.items():
        for field in FIGURES:  # each scope's total is its rows' sum
            assert report["total"][field] == pytest.approx(
                sum(r[field] for r in report["ledgers"])
            ), (by, field)
    assert totals["workspace"] == totals["run"]
    assert totals["run"]["waiting_gpu_hours"] > 0
    for by in ("machine", "pool"):
        held = {f: v for f, v in totals[by].items() if f != "lost_gpu_hours"}
        assert held == {
            **{f: v for f, v in totals["run"].items() if f != "lost_gpu_hours"},
            "waiting_gpu_hours": 0,
        }, by
    for by in SCOPES:
        hourly = (
            await get(client, token, "/goodput/series", by=by, step="hour", start=start.isoformat())
        ).json()
        assert len(hourly["points"]) >= 2  # the week crosses an hour's end
        for field in ("allocated_gpu_hours", "productive_gpu_hours", "waiting_gpu_hours"):
            summed = sum(p[field] for p in hourly["points"])
            assert summed == pytest.approx(reports[by]["total"][field]), (by, field)
        weekly = (await get(client, token, "/goodput/weekly", weeks=1, by=by)).json()
        [week] = weekly["weeks"]
        assert week["week"] == "2026-W40"
        assert figures(week["total"]) == pytest.approx(totals[by]), by
        assert [r["name"] for r in week["ledgers"]] == names[by]


async def test_a_run_without_gpus_has_no_goodput_and_counts_in_no_sum(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # seed G-17: only GPU time is counted; runs without GPUs have no goodput. An ETL run of
    # 8 cores and no GPU runs beside a GPU run on the same machine for ten minutes: no row of
    # any scope has its time, and its own ledger holds nothing.
    await world.machine("gpu-07")
    await world.submit(name="etl", workers=1, gpus=0, cpu=8)
    await world.submit(name="train", workers=1, gpus=2)
    await world.schedule()
    await world.start("etl-0", "train-0")
    await minutes(world, 10, {"train-0": 0.9})
    token = tenancy.member_token
    by_run = (await get(client, token, "/goodput", by="run", start=SEED_TIME.isoformat())).json()
    assert [r["name"] for r in by_run["ledgers"]] == ["train"]
    train = by_run["ledgers"][0]
    counted = (counting.minute_floor(world.clock.now()) - SEED_TIME).total_seconds()
    assert train["allocated_gpu_hours"] == pytest.approx(2 * counted / 3600)
    for by in ("machine", "workspace"):
        body = (await get(client, token, "/goodput", by=by, start=SEED_TIME.isoformat())).json()
        assert body["total"]["allocated_gpu_hours"] == pytest.approx(train["allocated_gpu_hours"])
    own = (await get(client, token, "/runs/etl/goodput")).json()
    assert "goodput" not in own
    assert own["allocated_gpu_hours"] == own["waiting_gpu_hours"] == 0
    assert set(own["gpu_hours"].values()) == {0}
