"""Samples in from a machine: names resolved, the unknown dropped, resends not doubled
(seed L-34, L-35, L-36)."""

from __future__ import annotations

from sqlalchemy import select

from backend.access import service as access
from backend.accounting import counting
from backend.db import Database
from backend.metrics import rules
from backend.metrics.service import SampleIn
from backend.models import MetricSample, Worker
from backend.runs import service as runs
from tests.metrics.conftest import SECOND, T0, Placed, ingest, series
from tests.support import FakeClock, Tenancy


async def stored(db: Database) -> list[tuple[str, int, int, int, float, int]]:
    """(worker, metric id, gpu, ts, value, machine) of every stored sample, in key order."""
    async with db.read() as session:
        rows = await session.execute(
            select(
                Worker.name,
                MetricSample.metric,
                MetricSample.gpu,
                MetricSample.ts,
                MetricSample.value,
                MetricSample.machine_id,
            )
            .join(Worker, Worker.id == MetricSample.worker_id)
            .order_by(Worker.name, MetricSample.metric, MetricSample.gpu, MetricSample.ts)
        )
        return [tuple(r) for r in rows]  # type: ignore[misc]


async def test_every_metric_of_the_catalogue_is_kept_under_its_worker(
    db: Database, placed: Placed
) -> None:
    # seed L-34: the worker's own metrics; L-35, L-36: per GPU (gpu label), GPM ratios
    samples = [
        SampleIn("llama-sft-0", m.name, 2 if m.per_gpu else None, T0, float(m.id))
        for m in rules.CATALOGUE
    ]
    assert await ingest(db, placed.gpu07, samples) == 11
    assert await stored(db) == [
        ("llama-sft-0", m.id, 2 if m.per_gpu else -1, T0, float(m.id), placed.gpu07)
        for m in rules.CATALOGUE
    ]


async def test_what_cannot_be_placed_is_dropped_and_counted_never_refused(
    db: Database, placed: Placed
) -> None:
    kept = SampleIn("llama-sft-0", "task_cpu_usage_cores", None, T0, 3.5)
    samples = [
        kept,
        SampleIn("llama-sft-1", "task_cpu_usage_cores", None, T0, 1.0),  # placed on gpu-08
        SampleIn("sweep-7-0", "task_cpu_usage_cores", None, T0, 1.0),  # another workspace's
        SampleIn("nobody-0", "task_cpu_usage_cores", None, T0, 1.0),
        SampleIn("llama-sft-0", "task_disk_bytes", None, T0, 1.0),  # not a metric we keep
        SampleIn("llama-sft-0", "task_cpu_usage_cores", 0, T0, 1.0),  # not per GPU
        SampleIn("llama-sft-0", "task_gpu_utilization_ratio", None, T0, 1.0),  # per GPU
        SampleIn("llama-sft-0", "task_gpu_utilization_ratio", 16, T0, 1.0),  # no such slot
        SampleIn("llama-sft-0", "task_memory_used_bytes", None, T0, float("nan")),
    ]
    assert await ingest(db, placed.gpu07, samples) == 1
    assert await stored(db) == [("llama-sft-0", 1, -1, T0, 3.5, placed.gpu07)]
    assert await ingest(db, placed.gpu07, []) == 0


def test_the_reasons_for_dropping_are_counted_apart() -> None:
    # issue 17: the machine names workers by id and attempt; worker 1 runs its attempt 2 here
    workers = {1: 2}
    rows, dropped = rules.to_rows(
        [
            SampleIn(1, "task_cpu_usage_cores", None, T0, 1.0),
            SampleIn(1, "task_cpu_usage_cores", None, T0 + 1, 2.0, attempt=2),
            SampleIn(1, "task_cpu_usage_cores", None, T0 + 2, 3.0, attempt=1),  # an old attempt
            SampleIn(9, "task_cpu_usage_cores", None, T0, 1.0),  # not placed here
            SampleIn(1, "task_unknown", None, T0, 1.0),
            SampleIn(1, "task_gpu_utilization_ratio", None, T0, 1.0),
            SampleIn(1, "task_cpu_usage_cores", None, T0, float("inf")),
        ],
        workers,
        machine_id=7,
    )
    assert rows == [(1, T0, 1.0, 7, 1, -1), (1, T0 + 1, 2.0, 7, 1, -1)]
    assert dropped == rules.Dropped(unknown_worker=2, unknown_metric=1, bad_gpu=1, bad_value=1)
    assert dropped.total == 5


async def test_a_batch_resent_after_a_reconnect_is_stored_once(
    db: Database, placed: Placed
) -> None:
    batch = series("llama-sft-0", "task_gpu_utilization_ratio", [0.5, 0.6, 0.7], gpu=0)
    assert await ingest(db, placed.gpu07, batch) == 3
    assert await ingest(db, placed.gpu07, batch) == 0
    # The resend that carries new samples too: only those are new.
    more = batch + series(
        "llama-sft-0", "task_gpu_utilization_ratio", [0.8], gpu=0, start=T0 + 30 * SECOND
    )
    assert await ingest(db, placed.gpu07, more) == 1
    assert [(r[3], r[4]) for r in await stored(db)] == [
        (T0, 0.5),
        (T0 + 10 * SECOND, 0.6),
        (T0 + 20 * SECOND, 0.7),
        (T0 + 30 * SECOND, 0.8),
    ]


async def test_the_same_time_on_another_gpu_or_metric_is_another_sample(
    db: Database, placed: Placed
) -> None:
    samples = [
        SampleIn("llama-sft-0", "task_gpu_utilization_ratio", 0, T0, 0.1),
        SampleIn("llama-sft-0", "task_gpu_utilization_ratio", 1, T0, 0.2),
        SampleIn("llama-sft-0", "task_gpu_sm_active_ratio", 0, T0, 0.3),
    ]
    assert await ingest(db, placed.gpu07, samples) == 3


async def test_a_deleted_run_takes_its_samples_with_it(
    db: Database, placed: Placed, clock: FakeClock, tenancy: Tenancy
) -> None:
    # seed L-23: deleting a run deletes its workers, and with them their metrics.
    await ingest(db, placed.gpu07, series("llama-sft-0", "task_cpu_usage_cores", [1.0, 2.0]))
    async with db.transaction() as session:
        principal = await access.authenticate(session, tenancy.member_token)
        await runs.delete_run(session, clock, principal, "llama-sft", ledger=counting)
    assert await stored(db) == []
