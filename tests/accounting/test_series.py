"""Goodput over time (issue 23): a scope's ledger each hour or UTC day, from the same cells as
the report. The points cover the period once, and they sum to the report's row (or total)
for the same period and scope, by hour and by day, on both dialects; GraphQL and REST answer
the same; bad input is refused by name; another workspace reads nothing of it."""

from __future__ import annotations

import itertools
import math
from datetime import datetime, timedelta

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.accounting import reports, rules, series, viewers
from backend.accounting.rules import CATEGORIES, Ledger, Period
from backend.accounting.viewers import Viewer
from tests.lifecycle.world import World
from tests.support import Tenancy
from tests.support.accounting import sample_minutes, tick
from tests.support.api import get, graphql

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


# -- the points, pure --------------------------------------------------------------------------


@given(
    start=st.integers(0, 24 * 40),
    hours=st.integers(1, 24 * 30),
    step=st.sampled_from(["hour", "day"]),
)
def test_the_points_cover_the_period_once_in_order(start: int, hours: int, step: str) -> None:
    base = datetime.fromisoformat("2026-10-01T00:00:00+00:00")
    period = Period(base + start * HOUR, base + (start + hours) * HOUR)
    points = rules.series_points(period, step)
    assert points[0].start == period.start and points[-1].end == period.end
    assert all(a.end == b.start for a, b in itertools.pairwise(points))
    length = rules.STEPS[step]
    for p in points:
        assert timedelta(0) < p.end - p.start <= length
        if step == "day":  # within one UTC day, whole but the first and the last
            assert rules.day_floor(p.start) == rules.day_floor(p.end - HOUR)
    inner = points[1:-1]
    assert all(p.end - p.start == length for p in inner)
    days = {rules.day_floor(period.start + n * HOUR) for n in range(hours)}
    assert len(points) == (hours if step == "hour" else len(days))


def test_a_period_from_six_begins_with_that_days_last_eighteen_hours() -> None:
    base = datetime.fromisoformat("2026-10-01T06:00:00+00:00")
    points = rules.series_points(Period(base, base + 2 * DAY), "day")
    assert [(p.start.isoformat(), p.end.isoformat()) for p in points] == [
        ("2026-10-01T06:00:00+00:00", "2026-10-02T00:00:00+00:00"),
        ("2026-10-02T00:00:00+00:00", "2026-10-03T00:00:00+00:00"),
        ("2026-10-03T00:00:00+00:00", "2026-10-03T06:00:00+00:00"),
    ]


# -- the ledgers ------------------------------------------------------------------------------


@pytest.fixture
async def days(world: World) -> World:
    """From 22:17 to past two midnights (a day in part, a whole day, a day in part) two runs
    on two machines: llm (8 GPUs) placed at once and busy an hour of each four, sweep-7 (4
    GPUs) waiting four hours and more for a machine; the tick counting as it goes (on
    PostgreSQL minute by minute: its steady path)."""
    start = world.clock.now().replace(hour=22, minute=17, second=31)
    world.clock.advance(seconds=(start - world.clock.now()).total_seconds())
    await world.machine("gpu-07")
    await world.submit(name="llm", workers=1, gpus=8)
    await world.schedule()
    await world.start("llm-0")
    await world.submit(name="sweep-7", workers=1, gpus=4)  # no room: it waits
    await tick(world)
    for n in range(7):
        if n == 1:
            world.clock.advance(minutes=37)
            await world.machine("gpu-08")
            await world.schedule()
            await world.start("sweep-7-0")
        await sample_minutes(world, {0: 0.95}, 60)  # an hour busy (sweep-7: its rank 0 too)
        world.clock.advance(hours=3, seconds=13)  # three hours not sampled: idle
        await tick(world)
    return world


async def viewer_of(world: World) -> tuple[Viewer, object]:
    principal = await world.principal()
    async with world.db.read() as session:
        return await viewers.viewer_for(session, principal), principal


def close(a: Ledger, b: Ledger) -> bool:
    return all(
        math.isclose(a.held[c], b.held[c], abs_tol=1e-6)
        and math.isclose(a.not_held[c], b.not_held[c], abs_tol=1e-6)
        for c in CATEGORIES
    )


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(first=st.integers(0, 60), hours=st.integers(1, 60), step=st.sampled_from(["hour", "day"]))
async def test_the_points_sum_to_the_report_for_the_same_period_and_scope(
    days: World, first: int, hours: int, step: str
) -> None:
    # issue 23: "the series sums equal the report for the same period and scope"
    # seed G-18: per run, machine, pool and workspace, hour by hour and day by day
    viewer, principal = await viewer_of(days)
    begin = rules.day_floor(days.clock.now()) - 2 * DAY
    period = Period(begin + first * HOUR, begin + (first + hours) * HOUR)
    async with days.db.read() as session:
        for by in rules.SCOPES:
            report = await reports.report(session, viewer, by, period)
            whole = await series.series(
                session, viewer, principal, by=by, name=None, step=step, period=period
            )
            assert [(p.start, p.end) for p in whole.points] == [
                (p.start, p.end) for p in rules.series_points(period, step)
            ]
            assert close(whole.total, report.total), (by, whole.total, report.total)
            for row in report.rows:
                one = await series.series(
                    session, viewer, principal, by=by, name=row.name, step=step, period=period
                )
                assert close(one.total, row.ledger), (by, row.name)


async def test_each_hour_holds_what_happened_in_it(week: World) -> None:
    viewer, principal = await viewer_of(week)
    async with week.db.read() as session:
        found = await series.series(
            session,
            viewer,
            principal,
            by="run",
            name="llm",
            step="hour",
            period=Period(rules.hour_floor(week.clock.now()) - 3 * HOUR, week.clock.now()),
        )
    busy = [p for p in found.points if p.ledger.productive > 0]
    assert len(busy) == 2, "its 50 minutes busy, across an hour's end"
    for p in found.points:
        assert p.ledger.allocated <= 8 * 3600 + 1e-6  # 8 GPUs, an hour at most
        if p.ledger.allocated:
            assert p.ledger.goodput is not None and 0 <= p.ledger.goodput <= 1


# -- GraphQL and REST ------------------------------------------------------------------------

SERIES = """query($by: GoodputScope!, $name: String, $step: GoodputStep!, $start: DateTime) {
  goodputSeries(by: $by, name: $name, step: $step, start: $start) {
    by name step start end
    points { start end ledger { allocatedGpuHours productiveGpuHours goodput
      gpuHours { category gpuHours heldGpuHours } } }
    total { allocatedGpuHours productiveGpuHours goodput }
  }
}"""


async def test_graphql_and_rest_answer_the_same_series(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    start = (rules.day_floor(week.clock.now()) - 2 * DAY).isoformat()
    for by, name, step in (
        ("RUN", "llm", "DAY"),
        ("MACHINE", "gpu-08", "HOUR"),
        ("WORKSPACE", None, "DAY"),
    ):
        body = await graphql(
            client, tenancy.member_token, SERIES, by=by, name=name, step=step, start=start
        )
        assert "errors" not in body, body
        mine = body["data"]["goodputSeries"]
        params = {"by": by.lower(), "step": step.lower(), "start": start}
        if name:
            params["name"] = name
        answer = await get(client, tenancy.member_token, "/goodput/series", **params)
        assert answer.status_code == 200, answer.text
        rest = answer.json()
        assert (mine["by"], mine["name"], mine["step"]) == (by, name, step)
        assert (rest["by"], rest["name"], rest["step"]) == (by.lower(), name, step.lower())
        assert len(mine["points"]) == len(rest["points"]) > 1
        for ours, theirs in zip(mine["points"], rest["points"], strict=True):
            ledger = ours["ledger"]
            assert ledger["allocatedGpuHours"] == pytest.approx(theirs["allocated_gpu_hours"])
            assert ledger["productiveGpuHours"] == pytest.approx(theirs["productive_gpu_hours"])
            assert ledger["goodput"] == pytest.approx(theirs.get("goodput"))
            hours = {c["category"]: c["gpuHours"] for c in ledger["gpuHours"]}
            assert hours == pytest.approx(theirs["gpu_hours"])
        assert mine["total"]["allocatedGpuHours"] == pytest.approx(
            rest["total"]["allocated_gpu_hours"]
        )
        assert rest["total"]["allocated_gpu_hours"] > 0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"step": "minute"}, "step"),
        ({"by": "cluster"}, "by"),
        ({"start": "yesterday"}, "start"),
        ({"start": "2026-10-05T00:00:00Z", "end": "2026-10-04T00:00:00Z"}, "end"),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(
    client: httpx.AsyncClient, tenancy: Tenancy, params: dict[str, str], field: str
) -> None:
    answer = await get(client, tenancy.member_token, "/goodput/series", **params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "INVALID_PARAMETER"
    assert field in [e["field"] for e in answer.json()["errors"]]


async def test_another_workspaces_rows_are_not_found(
    client: httpx.AsyncClient, week: World, tenancy: Tenancy
) -> None:
    # team-b's member names default's run and default itself: neither is found, and what is
    # summed for it holds nothing of default's
    for by, name in (("run", "llm"), ("workspace", "default"), ("run", "no-such-run")):
        answer = await get(client, tenancy.other_token, "/goodput/series", by=by, name=name)
        assert answer.status_code == 404, answer.text
    mine = await get(client, tenancy.other_token, "/goodput/series", by="machine")
    assert mine.status_code == 200
    assert mine.json()["total"]["allocated_gpu_hours"] == 0
    body = await graphql(
        client, tenancy.other_token, '{ goodputSeries(by: RUN, name: "llm") { name } }'
    )
    assert body["errors"][0]["extensions"]["code"] == "NOT_FOUND"
