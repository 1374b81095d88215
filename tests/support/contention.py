"""Concurrent writers: PostgreSQL only, reads that conflict, a transaction that loses."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from sqlalchemy import text

from backend.db import Database


def postgresql_only(db: Database) -> None:
    if db.engine.dialect.name != "postgresql":
        pytest.skip("deadlocks and serialisation failures are PostgreSQL's")


@contextlib.asynccontextmanager
async def conflicting_reads(db: Database) -> AsyncIterator[None]:
    """Reading the events raises a real serialisation failure in PostgreSQL: the table is
    behind a view that raises it at each row."""
    statements = [
        """CREATE FUNCTION conflict() RETURNS boolean LANGUAGE plpgsql AS $$
        BEGIN
          RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001';
        END $$""",
        "ALTER TABLE events RENAME TO events_kept",
        "CREATE VIEW events AS SELECT * FROM events_kept WHERE conflict()",
    ]
    async with db.transaction() as session:
        for statement in statements:
            await session.execute(text(statement))
    try:
        yield
    finally:
        async with db.transaction() as session:
            await session.execute(text("DROP VIEW events"))
            await session.execute(text("ALTER TABLE events_kept RENAME TO events"))
            await session.execute(text("DROP FUNCTION conflict()"))


Losing = Callable[[str, int], Awaitable[None]]


@pytest.fixture
async def losing(db: Database) -> AsyncIterator[Losing]:
    """``lose(table, n)``: the next ``n`` writes of ``table`` raise a real deadlock in
    PostgreSQL (a sequence counts them: its count survives the rollback)."""
    if db.engine.dialect.name != "postgresql":
        pytest.skip("deadlocks are PostgreSQL's (SQLite's busy file: test_database_contention)")
    async with db.transaction() as session:
        await session.execute(text("CREATE SEQUENCE losses MINVALUE 0"))
        await session.execute(
            text(
                """CREATE FUNCTION lose() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF nextval('losses') <= 1000 THEN
                    RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01';
                  END IF;
                  RETURN COALESCE(NEW, OLD);
                END $$"""
            )
        )
    tables: list[str] = []

    async def lose(table: str, count: int) -> None:
        async with db.transaction() as session:
            if table not in tables:
                tables.append(table)
                await session.execute(
                    text(
                        f"CREATE TRIGGER lose BEFORE INSERT OR UPDATE OR DELETE ON {table} "
                        "FOR EACH ROW EXECUTE FUNCTION lose()"
                    )
                )
            await session.execute(text(f"SELECT setval('losses', {1000 - count}, true)"))

    try:
        yield lose
    finally:
        async with db.transaction() as session:
            for table in tables:
                await session.execute(text(f"DROP TRIGGER lose ON {table}"))
            await session.execute(text("DROP FUNCTION lose()"))
            await session.execute(text("DROP SEQUENCE losses"))
