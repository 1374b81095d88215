"""workspaces have a priority ceiling and a preemption policy

Revision ID: 0016
Revises: 0015
"""

import re
from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing workspaces get the default ceiling (50, a run's default priority); runs already
    # submitted above it keep their priority. No cluster lets workspaces preempt each other.
    # Plain ADD COLUMN, not a batch: on SQLite a batch rebuilds the table, and dropping the old
    # workspaces or clusters table would cascade to every run (foreign keys are on).
    op.add_column(
        "workspaces",
        sa.Column("priority_ceiling", sa.Integer(), server_default=sa.text("50"), nullable=False),
    )
    op.add_column(
        "clusters",
        sa.Column("preempt_over_quota", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    _unname_other_workspaces_runs()


# Sentences written before this revision may name another workspace's run.
ANOTHER = "a run of another workspace"
PREEMPTED = re.compile(r"Preempted by higher-priority work \((.+?)\)")
QUEUED = re.compile(r"^Queued behind (.+)$")
WAITING = re.compile(r"^Next to run: waiting for (.+) to stop$")
SENTENCES = ("%Preempted by higher-priority work (%", "Queued behind %", "Next to run: %")


def unnamed(reason: str, own: set[str]) -> str:
    """The sentence with every run not of the reader's workspace (``own``: its runs' names)
    shown as "a run of another workspace"; a name its own workspace also uses stays."""

    def one(name: str) -> str:
        return name if name in own or name == "…" else ANOTHER  # "…": no run was known

    reason = PREEMPTED.sub(lambda m: f"Preempted by higher-priority work ({one(m[1])})", reason)
    if m := QUEUED.match(reason):
        return f"Queued behind {one(m[1])}"
    if m := WAITING.match(reason):
        return f"Next to run: waiting for {', '.join(one(n) for n in m[1].split(', '))} to stop"
    return reason


def _unname_other_workspaces_runs() -> None:
    bind = op.get_bind()
    own: dict[int, set[str]] = defaultdict(set)
    for ws, name in bind.execute(sa.text("SELECT workspace_id, name FROM runs")):
        own[ws].add(name)
    like = " OR ".join(f"reason LIKE :p{i}" for i in range(len(SENTENCES)))
    patterns = {f"p{i}": p for i, p in enumerate(SENTENCES)}
    by_run = "(SELECT workspace_id FROM runs WHERE runs.id = {}.run_id)"
    # (table, how a row finds its workspace)
    for table, workspace in (
        ("runs", "workspace_id"),
        ("workers", by_run.format("workers")),
        ("state_transitions", by_run.format("state_transitions")),
        ("events", "workspace_id"),
    ):
        rows = bind.execute(
            sa.text(f"SELECT id, reason, {workspace} FROM {table} WHERE {like}"), patterns
        )
        _update(table, "reason", [(i, r, unnamed(r, own[ws])) for i, r, ws in rows])
    # A run winding down for a preemption keeps the run it stops for (its later sentences).
    rows = bind.execute(
        sa.text(
            "SELECT id, stop_by, workspace_id FROM runs "
            "WHERE stop_cause = 'preemption' AND stop_by NOT LIKE 'drain of %'"
        )
    )
    _update("runs", "stop_by", [(i, b, b if b in own[ws] else ANOTHER) for i, b, ws in rows])


def _update(table: str, column: str, rows: list[tuple[int, str, str]]) -> None:
    changes = [{"id": i, "after": after} for i, before, after in rows if after != before]
    if changes:
        op.get_bind().execute(
            sa.text(f"UPDATE {table} SET {column} = :after WHERE id = :id"), changes
        )


def downgrade() -> None:
    # ALTER TABLE … DROP COLUMN (SQLite 3.35+), not a batch rebuild: see upgrade.
    op.drop_column("clusters", "preempt_over_quota")
    op.drop_column("workspaces", "priority_ceiling")
