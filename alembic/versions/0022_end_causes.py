"""workers and runs keep the typed cause of an end (issue 22): the server classifies failures
from it and writes the sentences itself; rows written before are backfilled from their reasons
(a worker's from its last failure snapshot's)

Revision ID: 0022
Revises: 0021
"""

import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The sentences as they were written until this revision, each with the cause it said: read
# here once, never again (backend/lifecycle/sentences.py writes them from the cause from now on).
_WORKER_SENTENCES = (
    ("OOMKilled", "oom_killed"),
    ("ErrImagePull", "image_pull"),
    ("Exceeded its time limit", "time_limit"),
    ("Machine lost", "machine_lost"),
    ("Preempted by", "preempted"),
    ("Stalled", "stalled"),
    ("Lost: its container never started", "lost_before_start"),
    ("Lost: ", "lost"),
    ("Stopped before it started", "stopped_before_start"),
    ("Exited with code ", "exited"),
)
_RESTARTING = re.compile(r"^Restarting in [^:]*: ")
_GANG = re.compile(r"^Worker \S+ failed(?: on \S+)?: (.*); the gang does not run without it$")


def worker_cause(reason: str | None) -> str | None:
    for start, cause in _WORKER_SENTENCES:
        if (reason or "").startswith(start):
            return cause
    return None


def run_cause(state: str, reason: str) -> str | None:
    """A run's cause where its sentence gave advice: failed, restarting, torn down after a
    worker's failure, or preempted until it runs again."""
    inner = _RESTARTING.sub("", reason, count=1)
    gang = _GANG.match(inner)
    if gang:
        return worker_cause(gang.group(1)) or "not_started"
    if inner.startswith("Retry budget exhausted"):
        return "retry_budget"
    if re.match(r"^Worker \S+ stalled", inner) and (state == "Failed" or inner != reason):
        return "stalled"
    if inner.startswith("Preempted by"):
        return "preempted"
    if state == "Failed" or inner != reason:
        return worker_cause(inner)
    return None


def upgrade() -> None:
    for table in ("workers", "runs"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("cause", sa.String(length=32), nullable=True))
    bind = op.get_bind()
    workers = sa.table(
        "workers",
        sa.column("id", sa.BigInteger),
        sa.column("state", sa.String),
        sa.column("reason", sa.String),
        sa.column("cause", sa.String),
        sa.column("last_failure", sa.JSON),
    )
    for row in bind.execute(sa.select(workers)).all():
        # A worker's cause is its last failure snapshot's (its own failure writes one too).
        failure: dict[str, Any] | None = row.last_failure
        said = failure.get("reason") if failure else row.reason if row.state == "Failed" else None
        if said is not None:
            cause = worker_cause(said) or "not_started"  # a drive, its user: the agent's words
            bind.execute(workers.update().where(workers.c.id == row.id).values(cause=cause))
    runs = sa.table(
        "runs",
        sa.column("id", sa.BigInteger),
        sa.column("state", sa.String),
        sa.column("reason", sa.String),
        sa.column("cause", sa.String),
    )
    for row in bind.execute(sa.select(runs.c.id, runs.c.state, runs.c.reason)).all():
        cause = run_cause(row.state, row.reason or "")
        if cause is not None:
            bind.execute(runs.update().where(runs.c.id == row.id).values(cause=cause))


def downgrade() -> None:
    for table in ("runs", "workers"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("cause")
