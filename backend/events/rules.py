"""Events, pure: what one looks like to a reader (the events API, a webhook's receiver, a
stream), and what a listing may ask for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from backend.clock import iso_z
from backend.errors import FieldError
from backend.parsing import whole_number

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
BEFORE_PROBLEM = "must be an event id as the API gave it (an event's id or a page's next_before)"
# Longer than any transaction that writes events is open (see ``advance``).
SETTLE = timedelta(minutes=1)


DELETED_STATE = "Deleted"
FOUND_AT = "found_at"  # in an event's data: when it was found, where that is after it happened


def kind_of(worker: bool, state: str) -> str:
    """A worker's change is worker.state; a run's deletion run.deleted (issue 21: it was a
    run.state of state Deleted, so ?kind=run.deleted found none), else run.state."""
    if worker:
        return "worker.state"
    return "run.deleted" if state == DELETED_STATE else "run.state"


def event_data(phase: str | None, happened: datetime, found: datetime) -> dict[str, Any]:
    """An event's data: its phase, and when it was found where that is after it happened (a
    stall is dated from the worker's last progress, found a stall timeout later)."""
    data: dict[str, Any] = {"phase": phase} if phase else {}
    if found > happened:
        data[FOUND_AT] = iso_z(found)
    return data


def shown_kind(kind: str, state: str | None) -> str:
    """Rows written before run.deleted was its own kind read as run.deleted too."""
    return "run.deleted" if kind == "run.state" and state == DELETED_STATE else kind


@dataclass(frozen=True)
class EventView:
    """An event as a reader gets it: ``created_at`` when it happened, ``found_at`` when it
    was found (the same but for a stall, dated from the last progress); listed by id, the
    order they were found in."""

    id: int
    kind: str
    state: str | None
    reason: str
    run: str | None
    worker: str | None
    workspace: str
    created_at: datetime
    data: dict[str, Any]
    found_at: datetime | None = None

    def to_json(self, shown_id: str) -> dict[str, Any]:
        """As the API and webhooks send it: ``shown_id`` its id as the API shows it
        (backend/ids.py: opaque, the database's number behind it)."""
        return {
            "id": shown_id,
            "kind": self.kind,
            "state": self.state,
            "reason": self.reason,
            "run": self.run,
            "worker": self.worker,
            "workspace": self.workspace,
            "created_at": iso_z(self.created_at),
            "found_at": iso_z(self.found_at or self.created_at),
            "data": self.data,
        }


@dataclass(frozen=True)
class Listing:
    """Which events: of one run (by name) or all, newest first, before an id (the next page)."""

    name: str | None
    limit: int
    before: int | None
    kind: str | None


def parse_listing(
    name: str | None,
    limit: str | None,
    before: str | None,
    kind: str | None,
    opened: Callable[[str], int | None],
) -> tuple[Listing | None, list[FieldError]]:
    """``before`` is an id as the API shows it, ``opened`` the number behind it (None: no
    event id of this install)."""
    problems = []
    count = DEFAULT_LIMIT
    if limit not in (None, ""):
        count = whole_number(limit, 1, MAX_LIMIT) or 0
        if not count:
            problems.append(FieldError("limit", f"must be a whole number from 1 to {MAX_LIMIT}"))
    cursor = None
    if before not in (None, ""):
        cursor = opened(before)
        if cursor is None:
            problems.append(FieldError("before", BEFORE_PROBLEM))
    if problems:
        return None, problems
    return Listing(name or None, count, cursor, kind or None), []


@dataclass(frozen=True)
class Cursor:
    """How far a reader (a webhook, a subscription) has looked at its workspace's events.

    Every event up to ``cursor`` has been handed on (or did not match). ``horizon``
    is the highest id a pass looked at, at ``horizon_at``; events between the two are looked
    at again on each pass (those already handed are skipped)."""

    cursor: int
    horizon: int
    horizon_at: datetime | None


def advance(current: Cursor, looked_to: int, now: datetime) -> Cursor:
    """Where the cursor stands after a pass that looked at every visible event up to
    ``looked_to``.

    An event's id is taken when it is written, and its transaction may commit after one that
    took a larger id (PostgreSQL), so the events up to an id seen now may not all be visible
    yet. Those up to the horizon seen SETTLE ago are, unless a transaction stayed open longer
    than SETTLE: the cursor moves up to that horizon (no further than this pass looked), and
    the horizon to what this pass saw."""
    if current.horizon_at is not None and now - current.horizon_at < SETTLE:
        return current
    moved = current.cursor
    if current.horizon_at is not None:
        moved = max(current.cursor, min(current.horizon, looked_to))
    return Cursor(moved, max(moved, looked_to), now)
