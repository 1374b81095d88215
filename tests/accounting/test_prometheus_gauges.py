"""The values of `GET /goodput/metrics` (seed G-36 … G-42), not only their names: each gauge
against a history whose figures are known, played through the real services on a fake clock
and read by prometheus_client's parser."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from backend.alerts import service as alerts
from backend.machines import service as machines
from backend.machines.rules import FaultKind
from backend.models import Machine
from tests.accounting.seed_week import minutes
from tests.lifecycle.world import World
from tests.support import Tenancy
from tests.support.api import get

CATEGORIES = ("productive", "idle", "stalled", "starting", "restart", "failure", "preemption")


def gauges(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample by its name and its labels, in name order."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def of(metric: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return metric, tuple(sorted(labels.items()))


async def scrape(client: httpx.AsyncClient, token: str) -> dict[tuple[str, tuple], float]:
    answer = await get(client, token, "/goodput/metrics")
    assert answer.status_code == 200, answer.text
    return gauges(answer.text)


async def an_idle_hour_then_a_busy_half_hour(world: World) -> None:
    """train (4 GPUs) idle from 01:03 to 02:00 UTC, busy from 02:00 to 02:30 (now); done
    (2 GPUs) busy from 01:03 to 01:13, then it completed. Both on gpu-07 of pool h100."""
    now = world.clock.now()
    world.clock.advance(
        seconds=(now.replace(minute=3, second=0, microsecond=0) - now).total_seconds()
    )
    assert world.clock.now().strftime("%H:%M:%S.%f") == "01:03:00.000000"
    await world.machine("gpu-07", pool="h100")
    await world.submit(name="train", workers=1, gpus=4)
    await world.submit(name="done", workers=1, gpus=2)
    await world.schedule()
    await world.start("train-0", "done-0")
    await minutes(world, 10, {"train-0": 0.0, "done-0": 0.9})
    await world.report("done-0", "exited", exit_code=0)
    await minutes(world, 47, {"train-0": 0.0})
    await minutes(world, 30, {"train-0": 0.9})
    assert world.clock.now().strftime("%H:%M") == "02:30"


async def test_the_gauges_of_each_scope_and_run_in_the_hour_and_the_day(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # seed G-36: astraeus_goodput_ratio{scope,name,window}: scope cluster, workspace, machine
    # or pool; window hour (the current UTC hour: 02:00 on, train's busy half hour alone) or
    # day (the last 24 hours: both runs' time).
    # seed G-37: astraeus_goodput_gpu_hours{scope,name,window,category}, the same windows
    await an_idle_hour_then_a_busy_half_hour(world)
    got = await scrape(client, tenancy.member_token)
    day_held = 4 * 57 / 60 + 4 * 30 / 60 + 2 * 10 / 60
    day_productive = 4 * 30 / 60 + 2 * 10 / 60
    for scope, name in (
        ("cluster", "local"),
        ("workspace", "default"),
        ("machine", "gpu-07"),
        ("pool", "h100"),
    ):
        ratio = {
            w: got[of("astraeus_goodput_ratio", scope=scope, name=name, window=w)]
            for w in ("hour", "day")
        }
        assert ratio == {
            "hour": pytest.approx(1.0),
            "day": pytest.approx(day_productive / day_held),
        }, scope
        hours = {
            (w, c): got[
                of("astraeus_goodput_gpu_hours", scope=scope, name=name, window=w, category=c)
            ]
            for w in ("hour", "day")
            for c in (*CATEGORIES, "waiting")
        }
        expected = dict.fromkeys(hours, 0.0)
        expected[("hour", "productive")] = 4 * 30 / 60
        expected[("day", "productive")] = day_productive
        expected[("day", "idle")] = 4 * 57 / 60
        assert hours == pytest.approx(expected), scope
    # seed G-38: astraeus_run_goodput_gpu_hours{namespace,run,category}, a run's since it was
    # submitted, for runs still going (done completed: it has none)
    # seed G-39: astraeus_run_goodput_ratio{namespace,run}, the same period's
    runs = {labels for name, labels in got if name.startswith("astraeus_run_")}
    assert {dict(labels)["run"] for labels in runs} == {"train"}
    run_hours = {
        c: got[of("astraeus_run_goodput_gpu_hours", namespace="default", run="train", category=c)]
        for c in (*CATEGORIES, "waiting")
    }
    assert run_hours == pytest.approx(
        dict.fromkeys(run_hours, 0.0) | {"productive": 4 * 30 / 60, "idle": 4 * 57 / 60}
    )
    run_ratio = got[of("astraeus_run_goodput_ratio", namespace="default", run="train")]
    assert run_ratio == pytest.approx(30 / 87)
    own = (await get(client, tenancy.member_token, "/runs/train/goodput")).json()
    assert run_ratio == pytest.approx(own["goodput"])


async def test_workers_stalled_now_by_namespace(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # seed G-40: astraeus_workers_stalled{namespace}: workers stalled now. quiet-0 makes no
    # progress for its stall timeout (5 minutes) and is kept running: 1 in its workspace; the
    # other workspace's token sees its own namespace, 0.
    await world.machine("gpu-07")
    await world.submit(name="quiet", workers=1, gpus=1, stall_timeout="5m", on_stall="keep")
    await world.schedule()
    await world.start("quiet-0")
    stalled = of("astraeus_workers_stalled", namespace="default")
    world.clock.advance(minutes=4)
    await world.timers()
    assert (await scrape(client, tenancy.member_token))[stalled] == 0
    world.clock.advance(minutes=2)
    await world.timers()
    assert (await scrape(client, tenancy.member_token))[stalled] == 1
    theirs = await scrape(client, tenancy.other_token)
    assert theirs[of("astraeus_workers_stalled", namespace="team-b")] == 0
    assert stalled not in theirs


async def test_threshold_alerts_firing_are_shown_to_the_clusters_operators_only(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # seed G-42: astraeus_threshold_alerts_firing{metric}, a cluster's operators only: a GPU
    # fault fires gpu_faults (its threshold: 1 GPU unhealthy); the organisation's admin sees it
    # and the other metrics at 0, a workspace's member sees no such gauge.
    machine = await world.machine("gpu-07")
    async with world.db.transaction() as session:
        row = await session.scalar(select(Machine).where(Machine.id == machine))
        assert row is not None
        await machines.gpu_fault(
            session, world.clock, row, 5, "XID 79: fell off the bus", kind=FaultKind.XID
        )
    world.clock.advance(minutes=1)
    async with world.db.transaction() as session:
        await alerts.evaluate(session, world.clock)
    admin = await scrape(client, tenancy.admin_token)
    firing = {
        dict(labels)["metric"]: value
        for (name, labels), value in admin.items()
        if name == "astraeus_threshold_alerts_firing"
    }
    assert firing["gpu_faults"] == 1
    assert {m: v for m, v in firing.items() if m != "gpu_faults"} == dict.fromkeys(
        set(firing) - {"gpu_faults"}, 0.0
    )
    assert len(firing) > 1
    member = await scrape(client, tenancy.member_token)
    assert not [name for name, _ in member if name == "astraeus_threshold_alerts_firing"]
