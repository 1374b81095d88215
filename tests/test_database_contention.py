"""A transaction that lost to another (a deadlock, a serialisation failure, SQLite's locked
file) is not the database being away (issue 19: a deadlock on ``DELETE FROM workers`` was
answered DATABASE_UNAVAILABLE): the work is tried again whole, and if it keeps losing the
answer is CONFLICT_RETRY (409), through GraphQL and REST."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator

import httpx
import psycopg.errors
import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import OperationalError

from backend.accounting import counting
from backend.db import Database
from backend.db.retries import contention, database_away
from backend.gateway import service as agents
from backend.models import AgentCommand
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import gql
from tests.support.contention import conflicting_reads, postgresql_only

DELETE = """mutation($name: String!) {
  deleteRun(name: $name) { run { name state } errors { code message } }
}"""
RETRY = (
    "Other requests changed the same things at once and this one gave way; nothing was "
    "changed: send it again."
)


def test_what_counts_as_contention() -> None:
    deadlock = OperationalError("DELETE FROM workers", {}, psycopg.errors.DeadlockDetected())
    serial = OperationalError("UPDATE runs", {}, psycopg.errors.SerializationFailure())
    locked = OperationalError("BEGIN", {}, sqlite3.OperationalError("database is locked"))
    for error in (deadlock, serial, locked):
        assert contention(error)  # said CONFLICT_RETRY, though psycopg counts the first two
        # as operational errors: what waits and tries again while the database is away
        # (an agent's messages) waits for them too
    refused = OperationalError("SELECT 1", {}, psycopg.OperationalError("connection refused"))
    assert database_away(refused) and not contention(refused)
    assert not contention(ValueError("a bug"))


async def running_runs(world: World, count: int) -> list[str]:
    """``count`` runs of two one-GPU workers each, running on machines of eight GPUs."""
    for m in range((count * 2 + 7) // 8):
        await world.machine(f"gpu-{m:02d}", gpus=8)
    names = [f"r-{i:02d}" for i in range(count)]
    for name in names:
        await world.submit(name=name, workers=2, gpus=1)
    await world.schedule()
    for name in names:
        await world.start(f"{name}-0", f"{name}-1")
    return names


async def acknowledging(db: Database, clock: FakeClock, stop: asyncio.Event) -> int:
    """Each machine acknowledges its commands, again and again, newest first: what an agent
    does while its runs are deleted. Returns how many rounds it made."""
    rounds = 0
    while not stop.is_set():
        async with db.read() as session:
            rows = (await session.execute(select(AgentCommand.machine_id, AgentCommand.id))).all()
        by_machine: dict[int, list[int]] = {}
        for machine, command in rows:
            by_machine.setdefault(machine, []).append(command)
        for machine, commands in by_machine.items():
            async with db.transaction() as session:
                await agents.acknowledge(session, clock, machine, sorted(commands, reverse=True))
        rounds += 1
        await asyncio.sleep(0)
    return rounds


async def test_runs_deleted_many_at_once_are_all_deleted(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    names = await running_runs(world, 24)
    clock.advance(minutes=2)
    async with db.transaction() as session:
        await counting.tick(session, clock)  # the goodput mark exists, as in production
    stop = asyncio.Event()
    acks = asyncio.create_task(acknowledging(db, clock, stop))
    answers = []
    for six in range(0, len(names), 6):  # six at a time, as the CLI deletes them
        answers += await asyncio.gather(
            *(gql(client, tenancy.member_token, DELETE, name=n) for n in names[six : six + 6])
        )
    stop.set()
    assert await acks >= 1
    for name, answer in zip(names, answers, strict=True):
        assert "errors" not in answer, answer
        assert answer["data"]["deleteRun"] == {
            "run": {"name": name, "state": "Deleted"},
            "errors": [],
        }


@pytest.fixture
async def losing_deletes(db: Database) -> AsyncIterator[int]:
    """Deleting a worker raises a real deadlock in PostgreSQL, as many times as the test sets
    ``set_losses`` says (a sequence counts them: its count survives the rollback)."""
    postgresql_only(db)
    statements = [
        "CREATE SEQUENCE losses MINVALUE 0",
        """CREATE FUNCTION lose() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF nextval('losses') <= 1000 THEN
            RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01';
          END IF;
          RETURN OLD;
        END $$""",
        "CREATE TRIGGER lose BEFORE DELETE ON workers FOR EACH ROW EXECUTE FUNCTION lose()",
    ]
    async with db.transaction() as session:
        for statement in statements:
            await session.execute(text(statement))
    try:
        yield 0
    finally:
        async with db.transaction() as session:
            await session.execute(text("DROP TRIGGER lose ON workers"))
            await session.execute(text("DROP FUNCTION lose()"))
            await session.execute(text("DROP SEQUENCE losses"))


async def set_losses(db: Database, count: int) -> None:
    """The next ``count`` worker deletions lose (values up to 1000 do)."""
    async with db.transaction() as session:
        await session.execute(text(f"SELECT setval('losses', {1000 - count}, true)"))


async def test_a_deadlock_is_tried_again_and_persisting_is_a_conflict_to_retry(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy, losing_deletes: int
) -> None:
    world = World(db, clock, tenancy)
    await running_runs(world, 2)
    await set_losses(db, 2)  # two tries lose, the third wins
    once = await gql(client, tenancy.member_token, DELETE, name="r-00")
    assert once["data"]["deleteRun"] == {"run": {"name": "r-00", "state": "Deleted"}, "errors": []}
    await set_losses(db, 1000)  # every try loses
    always = await gql(client, tenancy.member_token, DELETE, name="r-01")
    assert always["data"]["deleteRun"] == {
        "run": None,
        "errors": [{"code": "CONFLICT_RETRY", "message": RETRY}],
    }
    assert (await world.run("r-01")).deleted_at is None  # nothing was changed


async def test_a_serialisation_failure_is_a_conflict_through_rest_and_graphql(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    postgresql_only(db)
    await World(db, clock, tenancy).submit(name="r-00")  # an event to read
    headers = {"Authorization": f"Bearer {tenancy.member_token}"}
    async with conflicting_reads(db):
        rest = await client.get("/v1/orgs/default/workspaces/default/events", headers=headers)
        graphql = await gql(client, tenancy.member_token, "{ events { events { id } } }")
    assert rest.status_code == 409, rest.text
    assert rest.json() == {"code": "CONFLICT_RETRY", "message": RETRY}
    assert graphql["data"] is None
    assert [(e["message"], e["extensions"]["code"]) for e in graphql["errors"]] == [
        (RETRY, "CONFLICT_RETRY")
    ]
