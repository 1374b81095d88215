"""What the goodput benchmarks (bench/goodput_tick.py, bench/goodput_report.py) share: the moments,
the cluster's shape, a fixed clock, and the runs copied in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from backend.metrics.rules import BY_NAME

T0 = datetime(2026, 10, 1, 10, 0, tzinfo=UTC)  # the workers are submitted
PRIME = T0 + timedelta(minutes=4)  # the minute counted before the timed one
T = T0 + timedelta(minutes=5)  # the timed minute [T, T + 1 min)
MINUTE = timedelta(minutes=1)
GPUS = 8
POOLS = 10
BUSY_SHARE = 0.8
UTILIZATION = BY_NAME["task_gpu_utilization_ratio"].id
SAMPLE_TYPES = ["int8", "int8", "float8", "int8", "int2", "int2"]
DAY1 = datetime(2026, 10, 5, tzinfo=UTC)  # the report's data: 8 whole days from here
LEDGER_TYPES = ["timestamptz", "int8", "int8", "text", "int8", "text", "bool", "float8"]
LEDGERS = (
    "goodput_hours",
    "goodput_days",
    "goodput_intervals",
    "goodput_open_intervals",
    "goodput_run_totals",
)

# the columns of a ledger cell (goodput_hours, goodput_days)
CELL = "workspace_id, cluster_id, scope, scope_id, category, held"


class FixedClock:
    def __init__(self, moment: datetime) -> None:
        self.moment = moment

    def now(self) -> datetime:
        return self.moment


# -- the cluster ---------------------------------------------------------------------------------


def copy_runs(
    conn: psycopg.Connection[Any], cluster: int, ws: int, runs: int, workers: int
) -> list[int]:
    """``runs`` running runs of ``workers`` workers of 8 GPUs; their ids in order."""
    with conn.cursor().copy(
        "COPY runs (workspace_id, cluster_id, name, spec, priority, worker_count, "
        "gpus_per_worker, state, reason, state_since, created_at, attempt, failures_in_row, "
        "started_at, running_since, placed_at) FROM STDIN"
    ) as copy:
        for r in range(runs):
            running = T0 + 2 * MINUTE
            copy.write_row(
                (
                    ws,
                    cluster,
                    f"run-{r:05d}",
                    "{}",
                    50,
                    workers,
                    GPUS,
                    "Running",
                    f"{workers} of {workers} workers running",
                    running,
                    T0,
                    1,
                    0,
                    T0 + MINUTE,
                    running,
                    T0 + MINUTE,
                )
            )
    return [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY id")]
