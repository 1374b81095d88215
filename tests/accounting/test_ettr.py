"""ETTR, the effective training time ratio (issue 23): a run's productive GPU time over its
gang's GPUs times its wall time since it was submitted, to its end (a run its owner stopped is
not charged past its stop) or, while it goes, to how far the ledgers have counted. Checked by
hand on a constructed run and on the seed's week, through REST and GraphQL."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import pytest

from backend.accounting import rules
from backend.lifecycle import service as lifecycle
from backend.models import AccountingMark
from tests.accounting.seed_week import minutes, play_seed_week
from tests.lifecycle.world import World
from tests.support import SEED_TIME, Tenancy
from tests.support.api import get, graphql

T = datetime.fromisoformat("2026-10-01T00:00:00+00:00")


def test_ettr_is_productive_time_over_the_gangs_gpus_times_its_wall_time() -> None:
    hour = timedelta(hours=1)
    assert rules.ettr(3 * 3600 * 8, 8, T, T + 4 * hour) == 0.75
    assert rules.ettr(0.0, 8, T, T + hour) == 0.0
    assert rules.ettr(0.0, 8, T, T) is None  # no time passed
    assert rules.ettr(0.0, 8, T, T - hour) is None  # counted before it was submitted


async def ettr_of(client: httpx.AsyncClient, token: str, run: str) -> tuple[float, float]:
    """(REST's, GraphQL's)."""
    rest = (await get(client, token, f"/runs/{run}/goodput")).json()
    body = await graphql(client, token, "query($n: String!) { run(name: $n) { ettr } }", n=run)
    assert "errors" not in body, body
    return rest["ettr"], body["data"]["run"]["ettr"]


async def test_a_run_stopped_by_its_owner_is_not_charged_past_its_stop(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # 4 GPUs, submitted on a minute: 30 minutes busy, 10 idle, stopped by its owner, then 20
    # minutes pass: 30 x 4 GPU-minutes productive of 40 x 4 possible
    start = world.clock.now().replace(second=0, microsecond=0) + timedelta(minutes=1)
    world.clock.advance(seconds=(start - world.clock.now()).total_seconds())
    await world.machine("gpu-07")
    await world.submit(name="train", workers=1, gpus=4)
    await world.schedule()
    await world.start("train-0")
    await minutes(world, 30, {"train-0": 0.9})
    await minutes(world, 10, {"train-0": 0.0})
    async with world.db.transaction() as session:
        await lifecycle.stop_run(session, world.clock, await world.run("train"), "alice")
    await world.report("train-0", "exited", exit_code=143)
    await minutes(world, 20, {})
    assert (await world.run("train")).ended_at == start + timedelta(minutes=40)
    assert await ettr_of(client, tenancy.member_token, "train") == (0.75, 0.75)


async def test_the_seed_weeks_runs_by_hand(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await play_seed_week(world)
    async with world.db.read() as session:
        mark = (await session.get(AccountingMark, 1)).counted_until  # type: ignore[union-attr]
    # both go on: llm running, sweep-7 waiting; the ledgers have counted to the last whole
    # minute (65 min 20 s after SEED_TIME, 01:02:11.402117: 02:07:00)
    assert mark == datetime.fromisoformat("2026-10-01T02:07:00+00:00")
    wall = (mark - SEED_TIME).total_seconds()
    assert wall == pytest.approx(64 * 60 + 48.597883)
    for run, gpus in (("llm", 2 * 4), ("sweep-7", 1 * 8)):
        used = (await get(client, tenancy.member_token, f"/runs/{run}/goodput")).json()[
            "productive_gpu_hours"
        ]
        rest, ours = await ettr_of(client, tenancy.member_token, run)
        assert rest == pytest.approx(used * 3600 / (gpus * wall), rel=1e-9)
        assert ours == pytest.approx(rest, rel=1e-12)
        assert 0 < rest < 1
