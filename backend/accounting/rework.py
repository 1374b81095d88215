"""Rework (issue 23): the productive GPU time spent doing again, after a restart, the steps
done since the last checkpoint. In a report's rows and total (by scope, with the runs whose
rework is unknown counted beside it), and in a run's own figure (each restart).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import interval_queries, rules
from backend.accounting.rules import Period
from backend.accounting.viewers import Viewer
from backend.clock import iso_z
from backend.models import Redo, Run


@dataclass(frozen=True)
class ScopeRework:
    """The rework in a row's (or a report's) productive time: the GPU-seconds of the runs
    whose rework is known, and how many runs restarted there without the checkpoint and step
    reports that make theirs known."""

    gpu_seconds: float
    unknown_runs: int

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    def shown_gpu_hours(self, one_run: bool) -> float | None:
        """A run's own figure is null when unknown ("unknown", not 0); a wider row's is what is
        known (its unknown runs counted beside it)."""
        return None if one_run and self.unknown_runs > 0 else self.gpu_hours

    def to_json(self, one_run: bool) -> dict[str, object]:
        return {
            "rework_gpu_hours": self.shown_gpu_hours(one_run),
            "rework_unknown_runs": self.unknown_runs,
        }


def _redo_span(piece: interval_queries.RedoPiece | Redo) -> rules.RedoSpan:
    return rules.RedoSpan(
        piece.restarted_at, piece.until, piece.reached_step, piece.checkpoint_step
    )


async def scope_rework(
    session: AsyncSession, viewer: Viewer, scope: str, period: Period
) -> tuple[dict[int, ScopeRework], ScopeRework]:
    """Each run's, machine's, pool's or workspace's rework over the period (by id), and the
    viewer's total: the productive time inside its runs' redos."""
    pieces = await interval_queries.redo_pieces(
        session,
        scope,
        period.start,
        period.end,
        workspace_ids=viewer.workspace_ids,
        cluster_id=viewer.cluster_id,
    )
    seconds: dict[int, list[float]] = defaultdict(list)
    unknown: dict[int, set[int]] = defaultdict(set)
    all_seconds: list[float] = []
    all_unknown: set[int] = set()
    for p in pieces:
        span = _redo_span(p)
        redone = rules.redone_seconds(p.start_at, p.end_at, p.gpus, span, period)
        if redone <= 0 or p.scope_id is None:
            continue
        if span.known:
            seconds[p.scope_id].append(redone)
            all_seconds.append(redone)
        else:
            unknown[p.scope_id].add(p.run_id)
            all_unknown.add(p.run_id)
    rows = {
        key: ScopeRework(math.fsum(seconds.get(key, [])), len(unknown.get(key, ())))
        for key in set(seconds) | set(unknown)
    }
    return rows, ScopeRework(math.fsum(all_seconds), len(all_unknown))


@dataclass(frozen=True)
class RedoFigure:
    """One restart of a run: where it went back to, what it had reached, and the GPU time it
    spent doing that again (None: unknown, the run reported no checkpoint or no step)."""

    attempt: int
    restarted_at: datetime
    checkpoint_step: int | None
    reached_step: int | None
    steps_redone: int | None
    until: datetime | None
    caught_up: bool
    gpu_seconds: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "restarted_at": iso_z(self.restarted_at),
            "checkpoint_step": self.checkpoint_step,
            "reached_step": self.reached_step,
            "steps_redone": self.steps_redone,
            "until": iso_z(self.until) if self.until is not None else None,
            "caught_up": self.caught_up,
            "gpu_hours": None if self.gpu_seconds is None else self.gpu_seconds / 3600,
        }


@dataclass(frozen=True)
class RunRework:
    """A run's rework since it was submitted: its restarts' redone GPU time (None: unknown,
    a restart without the reports that measure it), and each restart."""

    gpu_seconds: float | None
    redos: list[RedoFigure]

    @property
    def gpu_hours(self) -> float | None:
        return None if self.gpu_seconds is None else self.gpu_seconds / 3600

    def to_json(self) -> dict[str, object]:
        return {"gpu_hours": self.gpu_hours, "redos": [r.to_json() for r in self.redos]}


async def run_rework(session: AsyncSession, run: Run, now: datetime) -> RunRework:
    """The rework of a run the caller may see, since it was submitted."""
    found = await run_reworks(session, [(run.id, run.created_at, run.workspace_id)], now)
    return found[run.id]


async def run_reworks(
    session: AsyncSession, found: Sequence[tuple[int, datetime, int]], now: datetime
) -> dict[int, RunRework]:
    """Runs' rework since they were submitted (runs by id, submission time and workspace,
    which the caller may see): two queries for them all, none for runs that never restarted."""
    redos = await interval_queries.redos_of(session, [run_id for run_id, _, _ in found])
    by_run: dict[int, list[Redo]] = defaultdict(list)
    for r in redos:
        by_run[r.run_id].append(r)
    restarted = [f for f in found if f[0] in by_run]
    by_redo: dict[int, list[float]] = defaultdict(list)
    if restarted:
        since = {run_id: created for run_id, created, _ in restarted}
        pieces = await interval_queries.redo_pieces(
            session,
            "run",
            min(since.values()),
            max(now, *since.values()),
            workspace_ids=sorted({ws for _, _, ws in restarted}),
            run_ids=sorted(since),
        )
        for p in pieces:
            period = Period(since[p.run_id], max(now, since[p.run_id]))
            by_redo[p.redo_id].append(
                rules.redone_seconds(p.start_at, p.end_at, p.gpus, _redo_span(p), period)
            )
    out: dict[int, RunRework] = {}
    for run_id, _, _ in found:
        figures = []
        for r in by_run.get(run_id, []):
            span = _redo_span(r)
            figures.append(
                RedoFigure(
                    r.attempt,
                    r.restarted_at,
                    r.checkpoint_step,
                    r.reached_step,
                    span.steps_redone,
                    r.until,
                    r.caught_up,
                    math.fsum(by_redo.get(r.id, [])) if span.known else None,
                )
            )
        seconds = [f.gpu_seconds for f in figures]
        total = None if None in seconds else math.fsum(x for x in seconds if x is not None)
        out[run_id] = RunRework(total, figures)
    return out
