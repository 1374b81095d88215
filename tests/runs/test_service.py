"""Submitting and reading runs (seed L-1, L-42)."""

import pytest
from sqlalchemy import select

from backend.access import service as access
from backend.db import Database
from backend.errors import Conflict, InvalidInput, NotFound
from backend.models import Event, StateTransition, Worker
from backend.runs import service as runs
from backend.runs.rules import RUN_CREATED, WORKER_CREATED
from tests.support import SEED_TIME, FakeClock, Tenancy, row_counts, run_spec


async def _principal(db: Database, token: str):  # type: ignore[no-untyped-def]
    async with db.read() as session:
        return await access.authenticate(session, token)


async def test_a_submitted_run_is_pending_with_its_workers_and_history(
    db: Database, tenancy: Tenancy, clock: FakeClock
) -> None:
    # seed L-1, L-42: every run has a state and reason; every change is recorded with its time
    alice = await _principal(db, tenancy.member_token)
    async with db.transaction() as session:
        run = await runs.create_run(session, clock, alice, run_spec(time_limit="12h"))
    assert (run.name, run.state, run.reason, run.priority) == (
        "llama-sft",
        "Pending",
        RUN_CREATED,
        50,
    )
    assert run.spec["cluster"] == "local" and run.spec["time_limit"] == "12h"
    async with db.read() as session:
        workers = (await runs.workers_by_run(session, [run.id]))[run.id]
        history = (await runs.history_by_run(session, [run.id]))[run.id]
        worker_history = list(
            await session.scalars(
                select(StateTransition).where(StateTransition.worker_id.is_not(None))
            )
        )
        events = list(await session.scalars(select(Event).order_by(Event.id)))
    assert [(w.name, w.rank, w.state, w.reason, w.gpus) for w in workers] == [
        ("llama-sft-0", 0, "Pending", WORKER_CREATED, 1),
        ("llama-sft-1", 1, "Pending", WORKER_CREATED, 1),
    ]
    assert [(h.transition_at, h.state, h.reason) for h in history] == [
        (SEED_TIME, "Pending", "Run created")
    ]
    assert len(worker_history) == 2
    assert [(e.kind, e.run_name, e.worker_name, e.state) for e in events] == [
        ("run.state", "llama-sft", None, "Pending"),
        ("worker.state", "llama-sft", "llama-sft-0", "Pending"),
        ("worker.state", "llama-sft", "llama-sft-1", "Pending"),
    ]


async def test_a_refused_specification_writes_nothing(
    db: Database, tenancy: Tenancy, clock: FakeClock
) -> None:
    alice = await _principal(db, tenancy.member_token)
    before = await row_counts(db)
    with pytest.raises(InvalidInput) as caught:
        async with db.transaction() as session:
            await runs.create_run(session, clock, alice, run_spec(workers=0, time_limit="-1h"))
    assert [str(f) for f in caught.value.fields] == [
        "workers: must be at least 1",
        "time_limit: must not be negative",
    ]
    with pytest.raises(InvalidInput):
        async with db.transaction() as session:
            await runs.create_run(session, clock, alice, run_spec(cluster="nowhere"))
    assert await row_counts(db) == before


async def test_a_specification_with_a_reserved_variable_or_a_control_character_writes_nothing(
    db: Database, tenancy: Tenancy, clock: FakeClock
) -> None:
    # issue 17
    alice = await _principal(db, tenancy.member_token)
    before = await row_counts(db)
    with pytest.raises(InvalidInput) as caught:
        async with db.transaction() as session:
            await runs.create_run(
                session,
                clock,
                alice,
                run_spec(
                    command=["python3", "-c", "print(1)\x00"],
                    environment={"NVIDIA_VISIBLE_DEVICES": "all", "ASTRAEUS_RUN_JOBS": "1"},
                    mounts=[{"drive": "data", "path": "/data\n"}],
                ),
            )
    assert [str(f) for f in caught.value.fields] == [
        "command[2]: must not contain control characters (found U+0000)",
        "environment.NVIDIA_VISIBLE_DEVICES: selects devices, which Astraeus does for every worker",
        "environment.ASTRAEUS_RUN_JOBS: starts with ASTRAEUS_, which is reserved for Astraeus",
        "mounts[0].path: must not contain control characters (found U+000A)",
    ]
    assert await row_counts(db) == before


async def test_a_live_run_name_is_taken_in_its_workspace_only(
    db: Database, tenancy: Tenancy, clock: FakeClock
) -> None:
    alice = await _principal(db, tenancy.member_token)
    bob = await _principal(db, tenancy.other_token)
    async with db.transaction() as session:
        await runs.create_run(session, clock, alice, run_spec())
    before = await row_counts(db)
    with pytest.raises(Conflict) as caught:
        async with db.transaction() as session:
            await runs.create_run(session, clock, alice, run_spec(workers=1))
    assert caught.value.code == "RUN_EXISTS" and caught.value.fields[0].field == "name"
    assert await row_counts(db) == before
    async with db.transaction() as session:
        other = await runs.create_run(session, clock, bob, run_spec())
    assert other.name == "llama-sft"


async def test_a_run_of_another_workspace_is_absent(
    db: Database, tenancy: Tenancy, clock: FakeClock
) -> None:
    alice = await _principal(db, tenancy.member_token)
    bob = await _principal(db, tenancy.other_token)
    carol = await _principal(db, tenancy.foreign_token)
    async with db.transaction() as session:
        await runs.create_run(session, clock, alice, run_spec())
    async with db.read() as session:
        for outsider in (bob, carol):
            with pytest.raises(NotFound) as caught:
                await runs.get_run(session, outsider, "llama-sft")
            assert caught.value.code == "JOB_NOT_FOUND"
            assert await runs.list_runs(session, outsider, include_ended=True) == []
        # Naming the workspace does not help someone who is not an org admin.
        with pytest.raises(NotFound) as caught:
            await runs.get_run(session, bob, "llama-sft", workspace="default")
        assert caught.value.code == "WORKSPACE_NOT_FOUND"
        with pytest.raises(NotFound):
            await runs.get_run(session, carol, "llama-sft", workspace="default")


async def test_an_org_admin_reads_any_workspace_of_the_organisation(
    db: Database, tenancy: Tenancy, clock: FakeClock
) -> None:
    bob = await _principal(db, tenancy.other_token)
    admin = await _principal(db, tenancy.admin_token)
    async with db.transaction() as session:
        await runs.create_run(session, clock, bob, run_spec(name="sweep-7"))
    async with db.read() as session:
        found = await runs.get_run(session, admin, "sweep-7", workspace="team-b")
        assert found.name == "sweep-7"
        with pytest.raises(NotFound):
            await runs.get_run(session, admin, "sweep-7")  # its own workspace has no such run


async def test_runs_are_listed_newest_first(
    db: Database, tenancy: Tenancy, clock: FakeClock
) -> None:
    alice = await _principal(db, tenancy.member_token)
    for name in ("a", "b", "c"):
        async with db.transaction() as session:
            await runs.create_run(session, clock, alice, run_spec(name=name, workers=1))
        clock.advance(seconds=1)
    async with db.read() as session:
        listed = await runs.list_runs(session, alice)
        count = len(list(await session.scalars(select(Worker))))
    assert [r.name for r in listed] == ["c", "b", "a"]
    assert count == 3
