"""Alerts: the seed's goodput_drop and threshold alerts, firing and resolved as events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from backend.accounting.rules import Category, Ledger
from backend.alerts import rules
from backend.alerts import service as alerts
from backend.errors import InvalidInput
from backend.lifecycle import service as lifecycle
from backend.machines import service as machines
from backend.machines.rules import FaultKind
from backend.models import Event, Machine
from tests.lifecycle.world import World
from tests.support import Tenancy
from tests.support.accounting import sample_minutes, tick


def held(productive: float, idle: float) -> Ledger:
    """A ledger of so many GPU-hours productive and idle, all held."""
    h = dict.fromkeys(Category, 0.0)
    h[Category.PRODUCTIVE], h[Category.IDLE] = productive * 3600, idle * 3600
    return Ledger(h, dict.fromkeys(Category, 0.0))


@pytest.mark.parametrize(
    ("hour", "day", "fires"),
    [
        (held(3, 7), held(8, 2), True),  # 30%, 50 points under 80%
        (held(5, 5), held(8, 2), False),  # 50%: not under 50%
        (held(4, 6), held(5.5, 4.5), False),  # 40%, only 15 points under 55%
        (held(0.3, 0.6), held(8, 2), False),  # under one GPU-hour held in that hour
    ],
)
def test_goodput_drop_is_the_seeds_rule(hour: Ledger, day: Ledger, fires: bool) -> None:
    # seed G-44: under 50%, 20 points or more under the day before, one GPU-hour held
    found = rules.goodput_drop("workspace:default", 1, hour, day, rules.DEFAULTS, "10:00 UTC")
    assert (found is not None) is fires
    if found is not None:
        assert found.reason == (
            "Goodput of workspace default was 30% in the hour from 10:00 UTC, "
            "50 points under the day before (80%)"
        )


async def events(world: World) -> list[tuple[str, str]]:
    async with world.db.read() as session:
        rows = await session.scalars(
            select(Event).where(Event.kind.like("alert.%")).order_by(Event.id)
        )
        return [(e.kind, e.reason) for e in rows]


def test_a_slurm_import_behind_by_its_threshold_fires() -> None:  # issue 38 F3
    read = datetime(2026, 12, 4, 12, 0, 3, tzinfo=UTC)
    threshold = rules.DEFAULTS["slurm_import_lag"]
    assert threshold == 300
    assert rules.import_lag("hpc", read, read + timedelta(seconds=299), threshold) is None
    found = rules.import_lag("hpc", read, read + timedelta(minutes=7, seconds=30), threshold)
    assert found is not None
    assert (found.metric, found.subject, found.workspace_id, found.value) == (
        "slurm_import_lag",
        "cluster:hpc",
        None,
        450.0,
    )
    assert found.reason == (
        "The Slurm import of cluster hpc is 7m30s behind: it last read Slurm at "
        "2026-12-04 12:00:03 UTC, and its jobs are not counted past that (threshold 5m)"
    )
    assert rules.import_lag("hpc", read, read + timedelta(days=1), 0) is None  # turned off


async def test_a_workspace_whose_goodput_drops_fires_and_then_resolves(world: World) -> None:
    await world.machine("gpu-07")
    await world.submit(name="llm", workers=1, gpus=8)
    await world.schedule()
    await world.start("llm-0")
    # A busy day, sampled each minute and counted each half hour, then an idle hour counted
    # each minute.
    for _ in range(25 * 2):
        await sample_minutes(world, {0: 0.9}, 30)
        await tick(world)
    for _ in range(60):
        await sample_minutes(world, {0: 0.0}, 1)
        await tick(world)
    async with world.db.transaction() as session:
        evaluated = await alerts.evaluate(session, world.clock)
    assert [a.metric for a in evaluated.fired] == ["goodput_drop"]
    [(kind, reason)] = await events(world)
    assert kind == "alert.firing" and reason.startswith("Goodput of workspace default was ")
    async with world.db.transaction() as session:  # evaluated again: nothing new
        again = await alerts.evaluate(session, world.clock)
    assert again.fired == [] and again.resolved == []
    async with world.db.transaction() as session:  # the run ends: no hour held, resolved
        await lifecycle.stop_run(session, world.clock, await world.run("llm"), "alice")
    await world.report("llm-0", "exited", exit_code=143)
    world.clock.advance(hours=2)
    await tick(world)
    async with world.db.transaction() as session:
        resolved = await alerts.evaluate(session, world.clock)
    assert [a.metric for a in resolved.resolved] == ["goodput_drop"]
    assert [k for k, _ in await events(world)] == ["alert.firing", "alert.resolved"]


async def test_a_stalled_worker_and_a_gpu_fault_fire_threshold_alerts(world: World) -> None:
    machine = await world.machine("gpu-07")
    await world.submit(name="quiet", workers=1, gpus=1, stall_timeout="5m", on_stall="keep")
    await world.schedule()
    await world.start("quiet-0")
    world.clock.advance(minutes=6)
    await world.timers()
    async with world.db.transaction() as session:
        row = await session.get(Machine, machine)
        assert row is not None
        fault = "XID 79: the GPU reported a fatal error"
        await machines.gpu_fault(session, world.clock, row, 5, fault, kind=FaultKind.XID)
    async with world.db.transaction() as session:
        evaluated = await alerts.evaluate(session, world.clock)
    assert sorted((a.metric, a.subject, a.reason) for a in evaluated.fired) == [
        ("gpu_faults", "cluster:local", "1 GPU unhealthy in cluster local (threshold 1)"),
        (
            "workers_stalled",
            "workspace:default",
            "1 worker stalled in workspace default (threshold 1)",
        ),
    ]


async def test_thresholds_are_the_clusters_and_its_admins_set_them(
    world: World, tenancy: Tenancy
) -> None:
    # seed G-45
    admin = await world.principal(tenancy.admin_token)
    member = await world.principal(tenancy.member_token)
    async with world.db.transaction() as session:
        row = await alerts.set_threshold(session, world.clock, admin, "local", "workers_stalled", 3)
        assert row.value == 3
        with pytest.raises(InvalidInput) as bad:
            await alerts.set_threshold(
                session, world.clock, admin, "local", "goodput_drop.below", 2
            )
        assert [(f.field, f.reason) for f in bad.value.fields] == [
            ("value", "is a ratio: from 0 to 1")
        ]
        with pytest.raises(Exception) as refused:
            await alerts.set_threshold(session, world.clock, member, "local", "gpu_faults", 5)
        assert getattr(refused.value, "status", None) == 403  # needs an admin (issue 21)
