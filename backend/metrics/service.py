"""The metrics domain's entry point: samples in from the machines, ranges out to users, and old
samples summarised to minutes and pruned."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.errors import NotFound
from backend.metrics import range_queries, repository, rules
from backend.metrics.rules import MINUTE_MS, RangeParams, RangeRequest, SampleIn
from backend.organizations import service as organizations

__all__ = [
    "Pruned",
    "RangeAnswer",
    "RangeParams",
    "SampleIn",
    "ingest",
    "ingest_many",
    "prune",
    "range_query",
]

log = logging.getLogger(__name__)


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


async def ingest(session: AsyncSession, machine_id: int, samples: Sequence[SampleIn]) -> int:
    """Store a machine's samples of the workers placed on it; returns how many were stored.

    Samples of a worker not placed there (any more), of a metric this server does not know,
    and samples already stored (resent after a reconnect) are dropped and counted, never
    refused: an agent always lags a little behind placements, and a refusal would make it
    resend the same batch for ever."""
    workers = await repository.workers_on_machine(session, machine_id)
    rows, dropped = rules.to_rows(samples, workers, machine_id)
    stored = await repository.insert_samples(session, rows)
    if dropped.total or stored < len(rows):
        log.debug(
            "machine %s: %d samples stored; dropped %d already stored, %d of workers not "
            "placed there, %d of unknown metrics, %d with a wrong gpu, %d not finite",
            machine_id,
            stored,
            len(rows) - stored,
            dropped.unknown_worker,
            dropped.unknown_metric,
            dropped.bad_gpu,
            dropped.bad_value,
        )
    return stored


async def ingest_many(
    session: AsyncSession, batches: Sequence[tuple[int, Sequence[SampleIn]]]
) -> dict[int, int]:
    """Many machines' samples stored as ``ingest`` stores one machine's, with a query and a
    COPY for them all instead of a few statements each: how many were new, by machine."""
    placed = await repository.workers_on_machines(session, {m for m, _ in batches})
    rows: list[rules.Row] = []
    for machine_id, samples in batches:
        found, dropped = rules.to_rows(samples, placed.get(machine_id, {}), machine_id)
        rows.extend(found)
        if dropped.total:
            log.debug(
                "machine %s: dropped %d samples of workers not placed there, %d of unknown "
                "metrics, %d with a wrong gpu, %d not finite",
                machine_id,
                dropped.unknown_worker,
                dropped.unknown_metric,
                dropped.bad_gpu,
                dropped.bad_value,
            )
    return await repository.insert_samples_by_machine(session, rows)


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[int, float]]


@dataclass(frozen=True)
class RangeAnswer:
    request: RangeRequest
    series: list[Series]
    # The workers in scope whose machine's agent does not measure the metric, and why.
    unmeasured: list[str] = field(default_factory=list)
    not_measured: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{metric, kind, unit, start, end, step, series: [{labels, points}], unmeasured,
        not_measured}``, times in ms."""
        r = self.request
        return {
            "metric": r.metric.name,
            "kind": r.metric.kind,
            "unit": r.unit,
            "start": r.start_ms,
            "end": r.end_ms,
            "step": r.step_ms,
            "series": [
                {"labels": s.labels, "points": [[ms, v] for ms, v in s.points]} for s in self.series
            ],
            "unmeasured": self.unmeasured,
            "not_measured": self.not_measured,
        }


async def range_query(
    session: AsyncSession,
    principal: Principal,
    params: RangeParams,
    *,
    now: datetime,
    retention: timedelta,
    workspace: str | None = None,
) -> RangeAnswer:
    """A metric's series over a range, of the workspace's workers only.

    A run or worker named in ``match`` that the workspace does not have is absent (404), the
    same answer whether it exists elsewhere or nowhere. One statement: the workspace, its
    workers in scope with their machines, and the samples' buckets, read by the in-scope
    workers' ids alone (an index-only scan per series, in the index's order)."""
    raw_from = epoch_ms(now - retention)
    request = rules.parse_range(params, epoch_ms(now), raw_from_ms=raw_from)
    wanted = organizations.workspace_wanted(principal, workspace)
    found = await range_queries.range_rows(
        session,
        request,
        wanted if isinstance(wanted, int) else (principal.organization_id, wanted),
        with_minutes=request.start_ms < raw_from,
    )
    organizations.check_visible(principal, workspace, found.workspace)
    ws_name = principal.workspace_name if isinstance(wanted, int) else wanted
    run, worker = rules.missing_names(request, found.scoped)
    if run is not None:
        raise NotFound("JOB_NOT_FOUND", f"No run named '{run}' in workspace '{ws_name}'.")
    if worker is not None:
        raise NotFound("TASK_NOT_FOUND", f"No worker named '{worker}' in workspace '{ws_name}'.")
    placed = [w.machine for w in found.scoped if w.read and w.machine is not None]
    unmeasured, not_measured = rules.not_measured(request.metric.name, placed)
    names = [g.name for g in request.by]
    series = [Series(dict(zip(names, k, strict=True)), p) for k, p in found.series.items()]
    return RangeAnswer(request, series, unmeasured, not_measured)


@dataclass(frozen=True)
class Pruned:
    summarised: int
    deleted: int
    minutes_deleted: int


def _minute_floor(moment: datetime) -> int:
    ms = epoch_ms(moment)
    return ms - ms % MINUTE_MS


async def prune(
    session: AsyncSession, now: datetime, *, retention: timedelta, downsampled_retention: timedelta
) -> Pruned:
    """Samples older than ``retention`` become one-minute summaries, kept until
    ``downsampled_retention``; with that no longer than ``retention``, old samples just go.

    The cut falls on a whole minute, so no minute is ever summarised from half its samples;
    run again at the same time, it changes nothing."""
    cutoff = _minute_floor(now - retention)
    summarised = 0
    if downsampled_retention > retention:
        summarised = await repository.roll_up(session, cutoff)
    deleted = await repository.delete_samples(session, cutoff)
    minutes_deleted = await repository.delete_minutes(
        session, _minute_floor(now - max(downsampled_retention, retention))
    )
    return Pruned(summarised, deleted, minutes_deleted)


# A worker's metrics "now": its newest samples of the last few minutes (the agent samples
# every 5 s; a worker not sampled for this long shows none).
LATEST_WINDOW = timedelta(minutes=2)

Latest = dict[str, float | dict[str, float]]


async def latest(
    session: AsyncSession, worker_ids: Sequence[int], now: datetime
) -> dict[int, Latest]:
    """Each worker's newest value of each metric (per GPU, by GPU index, where the seed
    measures GPUs), from the last two minutes."""
    out: dict[int, Latest] = {w: {} for w in worker_ids}
    since = epoch_ms(now - LATEST_WINDOW)
    for worker_id, metric_id, gpu, value in await repository.latest(session, worker_ids, since):
        metric = rules.BY_ID.get(metric_id)
        if metric is None:
            continue
        values = out[worker_id]
        if metric.per_gpu:
            per_gpu = values.setdefault(metric.name, {})
            assert isinstance(per_gpu, dict)
            per_gpu[str(gpu)] = value
        else:
            values[metric.name] = value
    return {w: dict(sorted(v.items())) for w, v in out.items()}
