"""Fixtures: each database test runs on SQLite and on the real PostgreSQL.

The schema is built from the migrations once per backend; after each test every table is
emptied, so tests are isolated and a live server in another process can share the database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import text
from starlette.applications import Starlette

from backend import migrations
from backend.app import create_app
from backend.config import Settings
from backend.db import Database
from backend.models import Base
from backend.secrets import crypto
from tests.support import FakeClock, Tenancy, make_tenancy, searchable, server_settings

POSTGRES_ADMIN_URL = os.environ.get(
    "ASTRAEUS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def _postgres_database() -> Iterator[str]:
    name = f"astraeus_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session", autouse=True)
def encryption_keys() -> Iterator[crypto.Keyring]:
    """The keys secrets are encrypted with in this test process (never the user's key file)."""
    keys = crypto.Keyring([crypto.Fernet.generate_key().decode()])
    crypto.configure(keys)
    yield keys
    crypto.configure(None)


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'astraeus.db'}"
        migrations.upgrade(url)
        yield url
        return
    for url in _postgres_database():
        migrations.upgrade(url)
        yield url


async def _empty_all_tables(db: Database) -> None:
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    async with db.transaction() as session:
        if db.engine.dialect.name == "postgresql":
            await session.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for table in tables:
                await session.execute(text(f"DELETE FROM {table}"))


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database.from_url(database_url, pool_size=4)
    try:
        yield database
    finally:
        await _empty_all_tables(database)
        await database.dispose()


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's folder for the test, searchable by workloads' users (tests/support.py)."""
    return searchable(tmp_path)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def tenancy(db: Database, clock: FakeClock) -> Tenancy:
    return await make_tenancy(db, clock)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return server_settings(database_url, tmp_path)


@pytest.fixture
async def app(settings: Settings, db: Database, clock: FakeClock) -> AsyncIterator[Starlette]:
    application = create_app(settings, clock=clock, database=db)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://astraeus.test") as c:
        yield c
