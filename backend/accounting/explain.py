"""The intervals behind a figure (DESIGN §4, invariant 4): the worker intervals that make a
ledger of one run, machine, pool or workspace, maybe of one category, over a period.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting import interval_queries, ledger_queries
from backend.accounting.rules import Category, Period
from backend.accounting.viewers import Viewer, scope_of
from backend.clock import iso_z
from backend.errors import FieldError, InvalidInput, NotFound
from backend.parsing import whole_number


async def explain(
    session: AsyncSession,
    viewer: Viewer,
    principal: Principal,
    *,
    by: str | None,
    name: str | None,
    category: str | None,
    period: Period,
    limit: int = 1000,
) -> list[Explained]:
    """The worker intervals that make a ledger figure: of one run, machine, pool or workspace
    (by name), maybe one category, over the period (DESIGN §4, invariant 4)."""
    scope = scope_of(by)
    problems = []
    if category is not None and category not in {c.value for c in Category}:
        problems.append(FieldError("category", "must be one of " + ", ".join(Category)))
    if name is None or name == "":
        problems.append(FieldError("name", "is required: the run, machine, pool or workspace"))
    if problems:
        raise InvalidInput("INVALID_PARAMETER", problems)
    assert name is not None
    scope_id = await ledger_queries.scope_id(
        session, scope, name, principal.organization_id, viewer.workspace_ids
    )
    if scope_id is None:
        raise NotFound("NOT_FOUND", f"No {scope} named '{name}'.")
    filters: dict[str, int] = {f"{scope}_id": scope_id} if scope != "workspace" else {}
    workspace_ids = viewer.workspace_ids
    if scope == "workspace":
        workspace_ids = [i for i in (workspace_ids or [scope_id]) if i == scope_id]
    rows = await interval_queries.intervals_of(
        session,
        start=period.start,
        end=period.end,
        workspace_ids=workspace_ids,
        cluster_id=viewer.cluster_id,
        category=category,
        limit=limit,
        **filters,
    )
    machines = await ledger_queries.scope_names(
        session, "machine", [r.machine_id for r in rows if r.machine_id is not None]
    )
    run_names = await ledger_queries.scope_names(session, "run", [r.run_id for r in rows])
    out = []
    for r in rows:
        start, end = max(r.start_at, period.start), min(r.end_at, period.end)
        out.append(
            Explained(
                worker=r.worker_name,
                run=run_names.get(r.run_id),
                machine=machines.get(r.machine_id) if r.machine_id is not None else None,
                start=start,
                end=end,
                category=r.category,
                held=r.held,
                gpus=r.gpus,
                gpu_hours=(end - start).total_seconds() * r.gpus / 3600,
            )
        )
    return out


MAX_INTERVALS = 10_000


def interval_limit(raw: str | int | None) -> int:
    """How many intervals an explanation lists: 1 000 by default, at most 10 000."""
    if raw is None or raw == "":
        return 1000
    limit = whole_number(raw, 1, MAX_INTERVALS)
    if limit is None:
        raise InvalidInput(
            "INVALID_PARAMETER",
            [FieldError("limit", f"must be a whole number from 1 to {MAX_INTERVALS}")],
        )
    return limit


@dataclass(frozen=True)
class Explained:
    """A worker interval behind a figure, cut to the period asked."""

    worker: str
    run: str | None
    machine: str | None
    start: datetime
    end: datetime
    category: str
    held: bool
    gpus: int
    gpu_hours: float

    def to_json(self) -> dict[str, object]:
        return {
            "worker": self.worker,
            "run": self.run,
            "machine": self.machine,
            "start": iso_z(self.start),
            "end": iso_z(self.end),
            "category": self.category,
            "held": self.held,
            "gpus": self.gpus,
            "gpu_hours": self.gpu_hours,
        }
