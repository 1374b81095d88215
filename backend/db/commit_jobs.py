"""Jobs sent by the transaction that needs them, once it commits."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

_AFTER_COMMIT = "astraeus.after_commit"
_job_sender: Callable[[str], None] | None = None


def send_jobs_with(sender: Callable[[str], None] | None) -> None:
    """Where jobs asked for with ``after_commit`` go: the broker's send (backend/jobs/broker.py
    installs it). None in a process without a broker (a CLI command): the periodic jobs catch up."""
    global _job_sender
    _job_sender = sender


def after_commit(session: AsyncSession, job: str) -> None:
    """Send the job named ``job`` once this session's transaction has committed: never before
    (the job would not see what it changed), never if it rolls back, and only the try that
    commits of a unit tried again. Each job once per transaction, however often asked."""
    jobs: list[str] = session.info.setdefault(_AFTER_COMMIT, [])
    if job not in jobs:
        jobs.append(job)


@event.listens_for(Session, "after_commit")
def _send_after_commit(session: Session) -> None:
    jobs: list[str] = session.info.pop(_AFTER_COMMIT, [])
    if _job_sender is not None:
        for job in jobs:
            _job_sender(job)


@event.listens_for(Session, "after_rollback")
def _forget_after_rollback(session: Session) -> None:
    session.info.pop(_AFTER_COMMIT, None)
