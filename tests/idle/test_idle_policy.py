"""Idle policies (issue 41): a run whose every GPU stays under its utilization, each whole
minute, for its window is stopped ("Stopped — idle: GPU utilization under 5% for 3 min"), or its
workspace told once an idle spell; a busy minute, one busy GPU or a minute without samples (a
machine gone silent) is not idle. What the stops gave back is reported to its workspace alone."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from backend.errors import InvalidInput, NotFound
from backend.idle import rules
from backend.idle import service as idle
from backend.metrics.rules import BY_NAME
from backend.models import Event, MetricSample, Run, Worker
from tests.lifecycle.world import World
from tests.support import FakeClock
from tests.support.accounting import ledger, tick

pytestmark = pytest.mark.db

UTILIZATION = BY_NAME["task_gpu_utilization_ratio"].id
IDLE = 0.01
Value = Callable[[int, int], float | None]  # (minute from the start, GPU) -> utilization or none


async def running(world: World, idle_policy: dict[str, Any], name: str = "notebook") -> Run:
    """A run of one worker on 2 GPUs with the policy, running from the fake clock's now."""
    await world.machine("gpu-07", gpus=8)
    await world.submit(name=name, workers=1, gpus=2, idle=idle_policy)
    assert (await world.schedule()).placed == [name]
    await world.start(f"{name}-0")
    return await world.run(name)


async def sampled(world: World, run: Run, minutes: int, value: Value) -> None:
    """Its GPUs' utilization every 10 s for ``minutes`` whole minutes from the minute it began
    running in, as its agent would send them."""
    (worker,) = await world.workers(run.name)
    assert run.running_since is not None and worker.machine_id is not None
    first = run.running_since.replace(second=0, microsecond=0)
    rows = []
    for minute in range(minutes):
        for second in range(0, 60, 10):
            at = first + timedelta(minutes=minute, seconds=second)
            for gpu in range(2):
                figure = value(minute, gpu)
                if figure is not None:
                    rows.append(
                        MetricSample(
                            worker_id=worker.id,
                            metric=UTILIZATION,
                            gpu=gpu,
                            ts=int(at.timestamp() * 1000),
                            value=figure,
                            machine_id=worker.machine_id,
                        )
                    )
    async with world.db.transaction() as session:
        session.add_all(rows)


async def check(world: World, at: datetime) -> idle.Checked:
    world.clock.moment = at
    async with world.db.transaction() as session:
        return await idle.check(session, world.clock)


def past_minutes(run: Run, minutes: int) -> datetime:
    """15 s past the whole minute ``minutes`` after the one the run began running in (when the
    tick, and the idle check after it, runs)."""
    assert run.running_since is not None
    first = run.running_since.replace(second=0, microsecond=0)
    return first + timedelta(minutes=minutes, seconds=15)


async def events(world: World, kind: str) -> list[tuple[str | None, str]]:
    async with world.db.read() as session:
        rows = await session.scalars(select(Event).where(Event.kind == kind).order_by(Event.id))
        return [(e.state, e.reason) for e in rows if e.run_name == "notebook"]


async def test_a_run_idle_for_its_window_is_stopped_and_its_gpus_given_back(
    world: World, clock: FakeClock
) -> None:
    run = await running(world, {"gpu_utilization_below": 5, "for": "3m"})
    await sampled(world, run, 6, lambda minute, gpu: IDLE)
    # three whole minutes after the one it began running in: its window began before it ran
    assert (await check(world, past_minutes(run, 3))).stopped == []
    assert (await world.run("notebook")).state == "Running"

    found = past_minutes(run, 4)
    assert (await check(world, found)).stopped == ["notebook"]
    stopping = "Stopping — idle: GPU utilization under 5% for 3 min"
    assert await world.status("notebook") == ("Running", stopping)  # (a run has no Stopping)
    assert (await world.commands("gpu-07"))[-1] == ("stop", "notebook-0")
    (_, state, phase, held) = (await world.phases("notebook-0"))[-1]
    assert (state, phase, held) == ("Stopping", "stopping:idle", 2)  # still held, idle

    clock.advance(seconds=4)
    await world.report("notebook-0", "exited", exit_code=143)
    stopped = "Stopped — idle: GPU utilization under 5% for 3 min"
    assert await world.status("notebook") == ("Stopped", stopped)
    assert (await world.run("notebook")).cause == "idle"
    assert (await events(world, "worker.state"))[-2:] == [
        ("Stopping", stopping),
        ("Stopped", stopped),
    ]
    assert (await events(world, "run.state"))[-1] == ("Stopped", stopped)  # its webhooks' too
    # checked again: an ended run is not looked at
    assert (await check(world, past_minutes(run, 5))).stopped == []
    # its ledger: idle from the moment it ran until its GPUs came back, winding down included
    # (stopping:idle), every second of it held
    clock.moment = past_minutes(run, 7)
    await tick(world)
    counted = await ledger(world)
    assert run.running_since is not None
    ran = (found + timedelta(seconds=4) - run.running_since).total_seconds()
    assert counted[("idle", True)] == pytest.approx(2 * ran)
    assert ("productive", True) not in counted

    clock.moment = found + timedelta(minutes=30)
    principal = await world.principal()
    async with world.db.read() as session:
        report = await idle.report(session, clock, principal)
    assert report.runs_stopped == 1
    assert report.gpu_hours_given_back == pytest.approx(1.0)  # 2 GPUs for half an hour
    assert report.idle_gpu_hours_found == pytest.approx(0.1)  # 2 GPUs for 3 minutes
    (done,) = report.actions
    assert (done.run, done.action, done.at, done.gpus, done.reason) == (
        "notebook",
        "stop",
        found,
        2,
        stopped,
    )
    assert done.idle_since == found.replace(second=0) - timedelta(minutes=3)


@pytest.mark.parametrize(
    ("value", "below"),
    [
        (lambda minute, gpu: 0.9, 5),  # busy
        (lambda minute, gpu: 0.5 if minute == 2 else IDLE, 5),  # a busy minute in each window
        (lambda minute, gpu: 0.5 if gpu == 1 else IDLE, 5),  # one GPU busy
        (lambda minute, gpu: None if minute == 2 else IDLE, 5),  # a minute never measured
        (lambda minute, gpu: 0.06, 5),  # over 5%
        (lambda minute, gpu: 0.05, 5),  # at 5%: not under it
    ],
    ids=["busy", "a busy minute", "one GPU busy", "a silent minute", "6%", "5%"],
)
async def test_a_run_not_idle_in_every_minute_of_its_window_runs_on(
    world: World, value: Value, below: float
) -> None:
    run = await running(world, {"gpu_utilization_below": below, "for": "3m"})
    await sampled(world, run, 5, value)
    for minutes in (4, 5):  # its windows: minutes 1 to 3, 2 to 4
        assert (await check(world, past_minutes(run, minutes))).stopped == []
    assert (await world.run("notebook")).state == "Running"


async def test_the_threshold_is_the_policys_own(world: World) -> None:
    run = await running(world, {"gpu_utilization_below": 10, "for": "2m"})
    await sampled(world, run, 4, lambda minute, gpu: 0.06)
    assert (await check(world, past_minutes(run, 3))).stopped == ["notebook"]
    assert (await world.run("notebook")).reason == (
        "Stopping — idle: GPU utilization under 10% for 2 min"
    )


async def test_notify_tells_the_workspace_once_an_idle_spell_and_stops_nothing(
    world: World,
) -> None:
    run = await running(world, {"for": "2m", "action": "notify"})
    # idle minutes 0-3, busy minute 4, idle again from minute 5
    await sampled(world, run, 9, lambda minute, gpu: 0.9 if minute == 4 else IDLE)
    told = "Idle: GPU utilization under 5% for 2 min"
    assert (await check(world, past_minutes(run, 3))).notified == ["notebook"]
    assert await events(world, "run.idle") == [("Running", told)]
    assert (await check(world, past_minutes(run, 4))).notified == []  # the same spell
    assert (await check(world, past_minutes(run, 5))).notified == []  # busy: the spell ends
    assert (await check(world, past_minutes(run, 6))).notified == []  # minute 4 in the window
    assert (await check(world, past_minutes(run, 7))).notified == ["notebook"]  # a new spell
    assert await events(world, "run.idle") == [("Running", told), ("Running", told)]
    assert (await world.run("notebook")).state == "Running"
    async with world.db.read() as session:
        report = await idle.report(session, world.clock, await world.principal())
    assert [(a.action, a.gpu_hours_given_back) for a in report.actions] == [("notify", 0.0)] * 2
    assert report.runs_stopped == 0 and report.gpu_hours_given_back == 0


async def test_a_restart_begins_the_window_again(world: World, clock: FakeClock) -> None:
    run = await running(world, {"for": "3m"})
    await sampled(world, run, 8, lambda minute, gpu: IDLE)
    async with world.db.transaction() as session:  # placed again 2 minutes in: a new attempt
        found = await session.get(Run, run.id)
        assert found is not None
        found.running_since = past_minutes(run, 2)
    assert (await check(world, past_minutes(run, 4))).stopped == []
    assert (await check(world, past_minutes(run, 5))).stopped == []
    assert (await check(world, past_minutes(run, 6))).stopped == ["notebook"]


async def test_what_the_policies_did_is_its_workspaces_alone(world: World) -> None:
    run = await running(world, {"for": "2m"})
    await sampled(world, run, 4, lambda minute, gpu: IDLE)
    assert (await check(world, past_minutes(run, 3))).stopped == ["notebook"]
    async with world.db.read() as session:
        for token in (world.tenancy.other_token, world.tenancy.foreign_token):
            theirs = await idle.report(session, world.clock, await world.principal(token))
            assert theirs.actions == [] and theirs.gpu_hours_given_back == 0
        team_b = await world.principal(world.tenancy.other_token)
        with pytest.raises(NotFound):  # another workspace's, named: absent to a member
            await idle.report(session, world.clock, team_b, workspace="default")
        with pytest.raises(InvalidInput) as refused:
            await idle.report(session, world.clock, await world.principal(), days=0)
    assert [(f.field, f.reason) for f in refused.value.fields] == [
        ("days", "must be from 1 to 400")
    ]


def test_a_given_back_stop_counts_its_gpus_to_now_or_its_time_limit() -> None:
    at = datetime(2026, 12, 5, 12, 0, tzinfo=datetime.now().astimezone().tzinfo).astimezone()
    now = at + timedelta(hours=3)
    assert rules.given_back_hours(8, at, None, now, at - timedelta(days=7)) == 24
    assert rules.given_back_hours(8, at, at + timedelta(hours=1), now, at - timedelta(days=7)) == 8
    assert rules.given_back_hours(8, at, None, now, at + timedelta(hours=2)) == 8  # in the period
    assert rules.given_back_hours(8, at, at - timedelta(hours=1), now, at) == 0


async def test_workers_without_gpus_are_not_asked(world: World) -> None:
    # every worker of a run with a policy asks for GPUs (the spec refuses one without)
    run = await running(world, {"for": "2m"})
    async with world.db.read() as session:
        workers = list(await session.scalars(select(Worker).where(Worker.run_id == run.id)))
    assert [w.gpus for w in workers] == [2]
