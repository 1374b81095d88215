"""Jobs are sent by the transaction that needs them, once it has committed
(backend.db.commit_jobs): never before, never for one rolled back, once however often asked,
only for the try of a unit that committed."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from backend.db import Database
from backend.db.commit_jobs import after_commit, send_jobs_with
from backend.job_names import PASS_JOB
from backend.organizations import service as organizations
from tests.support import FakeClock

pytestmark = pytest.mark.db


@pytest.fixture
def sent() -> Iterator[list[str]]:
    jobs: list[str] = []
    send_jobs_with(jobs.append)
    yield jobs
    send_jobs_with(None)


async def test_a_job_is_sent_once_its_transaction_commits_and_once_only(
    db: Database, sent: list[str]
) -> None:
    async with db.transaction() as session:
        after_commit(session, "scheduling.pass")
        after_commit(session, "scheduling.pass")
        after_commit(session, "webhooks.deliver")
        await session.execute(text("SELECT 1"))
        assert sent == []  # not before the commit
    assert sent == ["scheduling.pass", "webhooks.deliver"]


async def test_a_transaction_rolled_back_sends_nothing(db: Database, sent: list[str]) -> None:
    with pytest.raises(RuntimeError):
        async with db.transaction() as session:
            after_commit(session, "scheduling.pass")
            await session.execute(text("SELECT 1"))
            raise RuntimeError("the work failed")
    async with db.transaction() as session:  # the next one does not send the first one's
        await session.execute(text("SELECT 1"))
    assert sent == []


async def test_a_unit_tried_again_sends_the_committed_tries_jobs_only(
    db: Database, sent: list[str]
) -> None:
    tries = 0

    async def work(session: AsyncSession) -> None:
        nonlocal tries
        tries += 1
        after_commit(session, f"job.{tries}")
        await session.execute(text("SELECT 1"))
        if tries == 1:  # loses to another transaction, as SQLite's locked file does
            raise OperationalError("BEGIN", {}, sqlite3.OperationalError("database is locked"))

    await db.unit(work, first_wait=0)
    assert tries == 2
    assert sent == ["job.2"]


async def test_a_service_that_lets_runs_fit_asks_for_a_scheduling_pass(
    db: Database, sent: list[str], clock: FakeClock
) -> None:
    async with db.transaction() as session:
        first = await organizations.bootstrap(session, clock)
        assert first is not None
    sent.clear()
    async with db.transaction() as session:
        org = await organizations.organization_by_name(session, first.organization)
        await organizations.set_quota(session, org.id, first.workspace, first.cluster, 4)
    assert sent == [PASS_JOB]
