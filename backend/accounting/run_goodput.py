"""A run's own goodput: its ledger since it was submitted (one run, or many in one query),
and its ETTR (productive time over its gang's GPUs times its wall time) read from that ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.accounting import ledger_queries, repository, rules
from backend.accounting.rules import Ledger, ledgers_by_id
from backend.models import Run
from backend.runs import service as runs


async def run_ledger(
    session: AsyncSession,
    principal: Principal,
    name: str,
    now: datetime,
    workspace: str | None = None,
) -> tuple[Run, Ledger]:
    """A run's own ledger since it was submitted."""
    run = await runs.get_run(session, principal, name, workspace=workspace)
    return run, (await run_ledgers(session, [(run.id, run.created_at)], now))[run.id]


async def run_ledgers(
    session: AsyncSession, found: Sequence[tuple[int, datetime]], now: datetime
) -> dict[int, Ledger]:
    """Runs' ledgers since they were submitted (runs by id and submission time, which the
    caller may see), in one query."""
    if not found:
        return {}
    since = rules.hour_floor(min(created for _, created in found))
    until = rules.hour_floor(now) + rules.HOUR
    sums = await ledger_queries.hour_sums(
        session, "run", since, until, scope_ids=[run_id for run_id, _ in found]
    )
    ledgers = ledgers_by_id(sums)
    return {run_id: ledgers.get(run_id) or Ledger.empty() for run_id, _ in found}


@dataclass(frozen=True)
class RunClock:
    """What a run's ETTR is computed from besides its ledger: its id, when it was submitted,
    when it ended (None: it goes on) and its gang's GPUs."""

    run_id: int
    submitted: datetime
    ended: datetime | None
    gpus: int


def run_clock(run: Run) -> RunClock:
    """What ``run_ettrs`` reads of a run besides its ledger."""
    return RunClock(run.id, run.created_at, run.ended_at, run.worker_count * run.gpus_per_worker)


async def run_ettrs(
    session: AsyncSession, found: Sequence[RunClock], now: datetime
) -> dict[int, float | None]:
    """Runs' ETTR (rules.ettr) from their ledgers, their wall time to their end or to how
    far the tick has counted, whichever is first (the ledger holds nothing later)."""
    ledgers = await run_ledgers(session, [(r.run_id, r.submitted) for r in found], now)
    mark = await repository.counted_until(session)
    out: dict[int, float | None] = {}
    for r in found:
        until = mark if r.ended is None or mark is None else min(r.ended, mark)
        out[r.run_id] = (
            None
            if until is None
            else rules.ettr(ledgers[r.run_id].productive, r.gpus, r.submitted, until)
        )
    return out
