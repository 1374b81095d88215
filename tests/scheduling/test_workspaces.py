"""Workspaces never meet (issue 18): reasons, priority ceilings and preemption across workspaces,
through the services and the database (SQLite and PostgreSQL).

`default` (member alice) and `team-b` (member bob) share the cluster `local`; default's admin
raised its ceiling to 100 (tests/support.py), team-b keeps the default 50.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, select, text

from alembic import command
from backend import migrations
from backend.db import Database
from backend.db.engine import sync_url
from backend.errors import FieldError, Forbidden, InvalidInput
from backend.machines import service as machines
from backend.models import (
    Cluster,
    Event,
    Machine,
    Run,
    StateTransition,
    Worker,
    Workspace,
    WorkspaceQuota,
)
from backend.organizations import service as organizations
from backend.runs import service as runs
from backend.scheduling import service as scheduling
from tests.lifecycle.world import LEASE, World
from tests.support import FakeClock, Tenancy, row_counts

OTHER = "a run of another workspace"


async def reasons_seen_by(db: Database, workspace: str) -> list[str]:
    """Every sentence a workspace's members can read: its runs' and workers' reasons, their
    history and the workspace's events."""
    async with db.read() as session:
        ws_id = await session.scalar(select(Workspace.id).where(Workspace.name == workspace))
        runs_of = select(Run.id).where(Run.workspace_id == ws_id)
        found = list(await session.scalars(select(Run.reason).where(Run.workspace_id == ws_id)))
        found += await session.scalars(
            select(StateTransition.reason).where(StateTransition.run_id.in_(runs_of))
        )
        found += await session.scalars(select(Event.reason).where(Event.workspace_id == ws_id))
        found += await session.scalars(select(Worker.reason).where(Worker.run_id.in_(runs_of)))
        return [r for r in found if r]


async def set_quota(db: Database, workspace: str, gpus: int | None) -> None:
    async with db.transaction() as session:
        org = await organizations.organization_by_name(session, "default")
        await organizations.set_quota(session, org.id, workspace, "local", gpus)


async def quotas(db: Database) -> list[tuple[str, int]]:
    async with db.read() as session:
        rows = await session.execute(
            select(Workspace.name, WorkspaceQuota.gpus)
            .join(Workspace, Workspace.id == WorkspaceQuota.workspace_id)
            .join(Cluster, Cluster.id == WorkspaceQuota.cluster_id)
            .where(Cluster.name == "local")
        )
        return [(name, gpus) for name, gpus in rows]


async def test_an_admin_sets_changes_and_removes_a_quota(world: World, db: Database) -> None:
    await set_quota(db, "team-b", 8)
    await set_quota(db, "team-b", 4)
    assert await quotas(db) == [("team-b", 4)]
    await set_quota(db, "team-b", None)
    await set_quota(db, "team-b", None)
    assert await quotas(db) == []


async def allow_over_quota_preemption(db: Database) -> None:
    async with db.transaction() as session:
        org = await organizations.organization_by_name(session, "default")
        await organizations.set_preemption_policy(session, org.id, "local", True)


# -- the priority ceiling ------------------------------------------------------------------------


async def test_a_priority_above_the_workspaces_ceiling_is_refused_and_writes_nothing(
    world: World, db: Database, tenancy: Tenancy
) -> None:
    before = await row_counts(db)
    with pytest.raises(InvalidInput) as refused:
        await world.submit(tenancy.other_token, name="mine", priority=51)
    assert refused.value.code == "INVALID_SPEC"
    assert refused.value.fields == [FieldError("priority", "at most 50 in workspace team-b")]
    assert refused.value.message == "priority: at most 50 in workspace team-b"
    assert await row_counts(db) == before
    run = await world.submit(tenancy.other_token, name="mine", priority=50)
    assert run.priority == 50


async def test_run_again_is_held_to_the_ceiling_too(
    world: World, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    await world.submit(tenancy.other_token, name="first", priority=50)
    async with db.transaction() as session:
        org = await organizations.organization_by_name(session, "default")
        await organizations.set_priority_ceiling(session, org.id, "team-b", 40)
    principal = await world.principal(tenancy.other_token)
    with pytest.raises(InvalidInput) as refused:
        async with db.transaction() as session:
            await runs.run_again(session, clock, principal, "first", "again")
    assert refused.value.fields == [FieldError("priority", "at most 40 in workspace team-b")]


async def test_only_organisation_admins_set_a_ceiling_within_0_to_100(
    world: World, db: Database, tenancy: Tenancy
) -> None:
    member = await world.principal(tenancy.other_token)
    admin = await world.principal(tenancy.admin_token)
    with pytest.raises(Forbidden):
        organizations.require_admin(member, "a workspace's priority ceiling")
    organizations.require_admin(admin, "a workspace's priority ceiling")
    async with db.transaction() as session:
        with pytest.raises(InvalidInput) as refused:
            await organizations.set_priority_ceiling(session, admin.organization_id, "team-b", 101)
        assert refused.value.fields == [FieldError("ceiling", "must be from 0 to 100")]
        ws = await organizations.set_priority_ceiling(session, admin.organization_id, "team-b", 80)
        assert ws.priority_ceiling == 80
    assert (await world.submit(tenancy.other_token, name="mine", priority=80)).priority == 80
    with pytest.raises(InvalidInput):
        await world.submit(tenancy.other_token, name="other", priority=81)


# -- reasons --------------------------------------------------------------------------------------


async def test_a_run_queued_behind_another_workspaces_run_is_not_told_its_name(
    world: World, db: Database, tenancy: Tenancy
) -> None:
    await world.machine("gpu-07", gpus=8)
    await world.submit(name="filler", workers=1, gpus=6)
    await world.schedule()
    await world.submit(name="default-secret-big", workers=1, gpus=4)
    await world.submit(tenancy.other_token, name="b-small", workers=1, gpus=1)
    await world.submit(name="default-small", workers=1, gpus=1)
    result = await world.schedule()
    assert result.reasons["b-small"] == f"Queued behind {OTHER}"
    assert result.reasons["default-small"] == "Queued behind default-secret-big"
    assert (await world.run("b-small")).reason == f"Queued behind {OTHER}"
    assert not [r for r in await reasons_seen_by(db, "team-b") if "default-" in r]


async def test_a_members_high_priority_does_not_preempt_another_workspaces_run(
    world: World, db: Database, tenancy: Tenancy
) -> None:
    await world.machine("gpu-07", gpus=8)
    await world.submit(name="default-low", workers=1, gpus=8, priority=0)
    await world.schedule()
    await world.start("default-low-0")
    await world.submit(tenancy.other_token, name="b-urgent", workers=1, gpus=8, priority=50)
    result = await world.schedule()
    assert result.preempted == []
    assert result.reasons["b-urgent"] == (
        "No machine fits: none has room now for a worker of 8 GPUs, 4 cores, 16 GiB"
        " (GPUs short on gpu-07)"
    )
    assert await world.status("default-low") == ("Running", "1 of 1 worker running")
    # Over its quota, default's run still stays: the admins have not allowed it.
    await set_quota(db, "default", 4)
    assert (await world.schedule()).preempted == []


async def test_under_the_admins_policy_an_over_quota_run_is_preempted_unnamed_both_ways(
    world: World, db: Database, tenancy: Tenancy
) -> None:
    await world.machine("gpu-07", gpus=8)
    await world.submit(name="default-low", workers=1, gpus=8, priority=0)
    await world.schedule()
    await world.start("default-low-0")
    await world.submit(tenancy.other_token, name="b-urgent", workers=1, gpus=8, priority=50)
    await set_quota(db, "default", 4)  # lowered: default holds 8
    await allow_over_quota_preemption(db)
    result = await world.schedule()
    assert result.preempted == ["default-low"]
    assert result.reasons["b-urgent"] == f"Next to run: waiting for {OTHER} to stop"
    preempted = f"Preempted by higher-priority work ({OTHER})"
    assert await world.status("default-low") == ("Running", preempted)
    await world.report("default-low-0", "exited", exit_code=143)
    assert await world.status("default-low") == ("Pending", preempted)
    await world.schedule()
    assert (await world.run("b-urgent")).state == "Starting"
    seen_by_default = await reasons_seen_by(db, "default")
    seen_by_b = await reasons_seen_by(db, "team-b")
    assert preempted in seen_by_default
    assert not [r for r in seen_by_default if "b-urgent" in r]
    assert not [r for r in seen_by_b if "default-low" in r]


# -- per-machine reasons --------------------------------------------------------------------------


async def test_members_read_pending_reasons_of_usable_machines_admins_of_every_machine(
    world: World, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    await world.machine("gpu-07", gpus=8)
    await world.machine("gpu-lost", gpus=8)
    await world.submit(tenancy.other_token, name="b-huge", workers=1, gpus=8, priority=50)
    await world.submit(name="default-fill", workers=1, gpus=8)
    world.clock.advance(seconds=LEASE.total_seconds() + 1)
    async with db.transaction() as session:
        gpu07 = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
        assert gpu07 is not None
        await machines.heartbeat(session, clock, gpu07.id, LEASE)
        await machines.expire_leases(session, clock, LEASE)
    member = await world.principal(tenancy.other_token)
    admin = await world.principal(tenancy.admin_token)
    async with db.read() as session:
        run = await runs.get_run(session, member, "b-huge")
        seen = await scheduling.pending_reasons(session, clock, member, run)
        everything = await scheduling.pending_reasons(session, clock, admin, run)
    assert [m for m, _ in seen] == ["gpu-07"]
    assert [m for m, _ in everything] == ["gpu-07", "gpu-lost"]
    assert dict(everything)["gpu-lost"] == "lost: its lease expired"


# -- sentences written before ---------------------------------------------------------------------


def test_0016_unnames_other_workspaces_runs_in_sentences_written_before(tmp_path: object) -> None:
    """A run preempted, queued or waiting before the upgrade keeps its sentences, with another
    workspace's run no longer named (a name its own workspace also uses stays)."""
    url = f"sqlite:///{tmp_path}/before.db"
    config = migrations.alembic_config(url)
    command.upgrade(config, "0015")
    engine = create_engine(sync_url(url))
    at = "2026-11-02 10:00:00.000000"
    run = (
        "INSERT INTO runs (id, workspace_id, cluster_id, name, spec, priority, worker_count, "
        "gpus_per_worker, state, reason, state_since, created_at, attempt, failures_in_row, "
        "stop_cause, stop_by) VALUES (:id, :ws, 1, :name, '{}', 50, 1, 8, :state, :reason, :at, "
        ":at, 0, 0, :cause, :by)"
    )
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO organizations (id, name, created_at) VALUES (1, 'o', :at)"),
            {"at": at},
        )
        conn.execute(
            text(
                "INSERT INTO clusters (id, organization_id, name, created_at) "
                "VALUES (1, 1, 'local', :at)"
            ),
            {"at": at},
        )
        for ws, name in ((1, "default"), (2, "team-b")):
            conn.execute(
                text(
                    "INSERT INTO workspaces (id, organization_id, name, created_at) "
                    "VALUES (:id, 1, :name, :at)"
                ),
                {"id": ws, "name": name, "at": at},
            )
        rows = [
            (
                1,
                1,
                "low",
                "Running",
                "Preempted by higher-priority work (b-urgent)",
                "preemption",
                "b-urgent",
            ),
            (
                2,
                2,
                "b-urgent",
                "Pending",
                "Next to run: waiting for low, b-mine to stop",
                None,
                None,
            ),
            (3, 2, "b-mine", "Pending", "Queued behind low", None, None),
            (4, 1, "shared", "Pending", "Preempted by higher-priority work (shared)", None, None),
            (5, 1, "owned", "Stopping", "Stopping: asked by alice", "owner", "alice"),
        ]
        for id_, ws, name, state, reason, cause, by in rows:
            conn.execute(
                text(run),
                {
                    "id": id_,
                    "ws": ws,
                    "name": name,
                    "state": state,
                    "reason": reason,
                    "at": at,
                    "cause": cause,
                    "by": by,
                },
            )
        conn.execute(
            text(
                "INSERT INTO state_transitions (run_id, transition_at, state, reason, held_gpus, "
                "gpus, accounted) VALUES (1, :at, 'Stopped', "
                "'Stopped: Preempted by higher-priority work (b-urgent)', 0, 0, 0)"
            ),
            {"at": at},
        )
        conn.execute(
            text(
                "INSERT INTO events (organization_id, workspace_id, run_id, run_name, kind, "
                "state, reason, data, created_at) VALUES (1, 1, 1, 'low', 'run.state', "
                "'Running', 'Preempted by higher-priority work (b-urgent)', '{}', :at)"
            ),
            {"at": at},
        )
    command.upgrade(config, "0016")
    with engine.connect() as conn:
        runs_after = conn.execute(text("SELECT name, reason, stop_by FROM runs ORDER BY id")).all()
        history = conn.execute(text("SELECT reason FROM state_transitions")).scalars().all()
        events = conn.execute(text("SELECT reason FROM events")).scalars().all()
        ceilings = conn.execute(text("SELECT priority_ceiling FROM workspaces")).scalars().all()
    engine.dispose()
    assert [tuple(r) for r in runs_after] == [
        ("low", f"Preempted by higher-priority work ({OTHER})", OTHER),
        ("b-urgent", f"Next to run: waiting for {OTHER}, b-mine to stop", None),
        ("b-mine", f"Queued behind {OTHER}", None),
        ("shared", "Preempted by higher-priority work (shared)", None),
        ("owned", "Stopping: asked by alice", "alice"),
    ]
    assert history == [f"Stopped: Preempted by higher-priority work ({OTHER})"]
    assert events == [f"Preempted by higher-priority work ({OTHER})"]
    assert ceilings == [50, 50]
