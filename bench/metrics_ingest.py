"""Metric samples: ingest, and range queries, each beside a bare baseline in the same run.

Ingest: the samples of 100 machines, each running 8 one-GPU workers that send 6 worker
metrics and 5 per-GPU metrics every 10 s, go through ``metrics.ingest()`` (names resolved,
resends skipped, binary COPY) one machine's batch per transaction; the baseline is a bare
psycopg ``COPY … (FORMAT BINARY)`` of the very same rows, already resolved, into the same
table with the same indexes, one batch per transaction. Reported as samples/s and a ratio
(target: ingest >= 0.5 x bare).

Range queries over one run's ~1.1M samples (4 workers x 8 GPUs, 10 s apart, 3.6 days):
``metrics.range_query()`` (the whole read: its session begun and ended, the workspace, the
names and the machines found in the same statement as the samples) against bare SQL of the
same aggregation with psycopg, each on one connection that has run it before (WARM_RUNS): a
GPU metric averaged by worker over the whole span (1M samples -> 4 x 300 points), a counter's
rate by worker (125k samples), and the last hour of one GPU (360 samples; target: ratio <= 3).

    python -m bench.metrics_ingest [--only ingest|ranges] [--samples 1000000] [--trials 3]
        [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import text

from backend.access.rules import Principal
from backend.db import Database
from backend.metrics import service as metrics
from backend.metrics.rules import BY_NAME, CATALOGUE, ROW_COLUMNS, SampleIn, to_rows
from backend.metrics.service import RangeParams
from bench.common import Timer, fresh_database, median, save, tenancy

T0 = datetime(2026, 10, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
EVERY_MS = 10_000
MACHINES, WORKERS_PER_MACHINE = 100, 8
WORKER_METRICS = [m.name for m in CATALOGUE if not m.per_gpu]
GPU_METRICS = [m.name for m in CATALOGUE if m.per_gpu]
PG_TYPES = ["int8", "int8", "float8", "int8", "int2", "int2"]


# -- the cluster ---------------------------------------------------------------------------------


def populate(url: str, machines: int, workers_per_machine: int) -> dict[str, Any]:
    """An organisation, a workspace, machines, and one running one-worker run per GPU slot."""
    with psycopg.connect(url) as conn:
        org, cluster, ws = tenancy(conn, T0)
        machine_ids = [
            conn.execute(
                "INSERT INTO machines (cluster_id, name, cpu_cores, memory_bytes, state, reason, "
                "labels, created_at) VALUES (%s, %s, 128, 0, 'ready', 'Registered', '{}', %s) "
                "RETURNING id",
                (cluster, f"gpu-{m:04d}", T0),
            ).fetchone()[0]
            for m in range(machines)
        ]
        placed: dict[int, list[int]] = {}  # the ids of the workers on each machine
        for m, machine_id in enumerate(machine_ids):
            for w in range(workers_per_machine):
                name = f"run-{m}-{w}"
                ids = _running_run(conn, ws, cluster, name, workers=1, machine_id=machine_id)
                placed.setdefault(machine_id, []).extend(ids)
        conn.execute("ANALYZE")
    return {"organization": org, "workspace": ws, "placed": placed}


def _running_run(
    conn: psycopg.Connection[Any], ws: int, cluster: int, name: str, workers: int, machine_id: int
) -> list[int]:
    run = conn.execute(
        "INSERT INTO runs (workspace_id, cluster_id, name, spec, priority, worker_count, "
        "gpus_per_worker, state, reason, state_since, created_at, attempt, failures_in_row) "
        "VALUES (%s, %s, %s, '{}', 50, %s, 8, 'Running', 'Running', %s, %s, 1, 0) RETURNING id",
        (ws, cluster, name, workers, T0, T0),
    ).fetchone()[0]
    return [
        conn.execute(
            "INSERT INTO workers (run_id, rank, name, state, reason, state_since, machine_id, "
            "gpu_ids, gpus, attempt, restarts, ready, phase, created_at) VALUES (%s, %s, %s, "
            "'Running', 'Running', %s, %s, '[0,1,2,3,4,5,6,7]', 8, 1, 0, true, 'productive', %s) "
            "RETURNING id",
            (run, rank, f"{name}-{rank}", T0, machine_id, T0),
        ).fetchone()[0]
        for rank in range(workers)
    ]


# -- ingest --------------------------------------------------------------------------------------


def machine_batches(
    placed: dict[int, list[int]], total: int, batch: int
) -> list[tuple[int, list[SampleIn]]]:
    """Each machine's samples, tick after tick, cut into batches; machines take turns."""
    rng = random.Random(7)
    per_machine = total // len(placed)
    streams: dict[int, list[SampleIn]] = {}
    for machine_id, workers in placed.items():
        samples: list[SampleIn] = []
        tick = 0
        while len(samples) < per_machine:
            at = T0_MS + tick * EVERY_MS
            for worker in workers:
                samples += [SampleIn(worker, m, None, at, rng.random()) for m in WORKER_METRICS]
                samples += [SampleIn(worker, m, 0, at, rng.random()) for m in GPU_METRICS]
            tick += 1
        streams[machine_id] = samples[:per_machine]
    cuts = range(0, per_machine, batch)
    return [(m, streams[m][i : i + batch]) for i in cuts for m in streams]


async def through_ingest(url: str, batches: list[tuple[int, list[SampleIn]]]) -> float:
    db = Database.from_url(url, pool_size=1)
    try:
        with Timer() as t:
            for machine_id, samples in batches:
                async with db.transaction() as session:
                    await metrics.ingest(session, machine_id, samples)
        return t.seconds
    finally:
        await db.dispose()


def bare_copy(url: str, batches: list[list[tuple[Any, ...]]]) -> float:
    statement = f"COPY metric_samples ({', '.join(ROW_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
    with psycopg.connect(url) as conn, Timer() as t:
        for rows in batches:
            with conn.cursor() as cursor, cursor.copy(statement) as copy:
                copy.set_types(PG_TYPES)
                for row in rows:
                    copy.write_row(row)
            conn.commit()
    return t.seconds


def empty_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE metric_samples")
        conn.execute("CHECKPOINT")


def resolved(url: str, batches: list[tuple[int, list[SampleIn]]]) -> list[list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        attempts = dict(conn.execute("SELECT id, attempt FROM workers").fetchall())
    out = []
    for machine_id, samples in batches:
        rows, dropped = to_rows(samples, attempts, machine_id)
        assert dropped.total == 0
        out.append(rows)
    return out


def bench_ingest(
    url: str, placed: dict[int, list[int]], total: int, batch: int, trials: int
) -> dict[str, Any]:
    batches = machine_batches(placed, total, batch)
    rows = resolved(url, batches)
    n = sum(len(b) for _, b in batches)
    ours: list[float] = []
    bare: list[float] = []
    for trial in range(trials):
        # Alternate who goes first, so neither always meets the warmer cache.
        for who in ("ingest", "bare") if trial % 2 == 0 else ("bare", "ingest"):
            empty_table(url)
            if who == "ingest":
                ours.append(n / asyncio.run(through_ingest(url, batches)))
            else:
                bare.append(n / bare_copy(url, rows))
    return {
        "samples": n,
        "batch": batch,
        "ingest_samples_per_s": median(ours),
        "bare_copy_samples_per_s": median(bare),
        "ratio": median(ours) / median(bare),
        "trials": {"ingest": ours, "bare_copy": bare},
    }


# -- range queries -------------------------------------------------------------------------------


def load_series(url: str, ws: int, cluster: int, machine_id: int, ticks: int) -> list[int]:
    """One run of 4 workers x 8 GPUs: its GPU utilisation (1M samples at the default size), CPU
    and received bytes, written server-side, then vacuumed so scans can be index-only."""
    with psycopg.connect(url) as conn:
        workers = _running_run(conn, ws, cluster, "llama-sft", workers=4, machine_id=machine_id)
        util, cpu = BY_NAME["task_gpu_utilization_ratio"].id, BY_NAME["task_cpu_usage_cores"].id
        received = BY_NAME["task_network_receive_bytes_total"].id
        conn.execute(
            f"INSERT INTO metric_samples ({', '.join(ROW_COLUMNS)}) "
            "SELECT w, %(t0)s + t * 10000, random(), %(m)s, %(util)s, g "
            "FROM unnest(%(workers)s::int8[]) w, generate_series(0, %(ticks)s - 1) t, "
            "generate_series(0, 7) g",
            {"t0": T0_MS, "m": machine_id, "util": util, "workers": workers, "ticks": ticks},
        )
        conn.execute(
            f"INSERT INTO metric_samples ({', '.join(ROW_COLUMNS)}) "
            "SELECT w, %(t0)s + t * 10000, x.value, %(m)s, x.metric, -1 "
            "FROM unnest(%(workers)s::int8[]) w, generate_series(0, %(ticks)s - 1) t, "
            "LATERAL (VALUES (%(cpu)s, 8 * random()), (%(rx)s, t * 125000.0)) x(metric, value)",
            {
                "t0": T0_MS,
                "m": machine_id,
                "cpu": cpu,
                "rx": received,
                "workers": workers,
                "ticks": ticks,
            },
        )
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE metric_samples")
    return workers


MONTH_SAMPLES = 30 * 24 * 240  # one GPU's memory every 15 s for 30 days: 172 800


def load_month(url: str, worker: int, machine_id: int, end_ms: int) -> int:
    """One worker's GPU 0 memory every 15 s for the 30 days up to ``end_ms``; their start."""
    start_ms = end_ms - MONTH_SAMPLES * 15_000
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO metric_samples ({', '.join(ROW_COLUMNS)}) "
            "SELECT %(w)s, %(t0)s + t::int8 * 15000, 40e9 + 1e9 * random(), %(m)s, %(metric)s, 0 "
            "FROM generate_series(0, %(n)s - 1) t",
            {
                "w": worker,
                "t0": start_ms,
                "m": machine_id,
                "metric": BY_NAME["task_gpu_memory_used_bytes"].id,
                "n": MONTH_SAMPLES,
            },
        )
        conn.execute("VACUUM ANALYZE metric_samples")
    return start_ms


BARE_MEAN_BY_WORKER = """
SELECT w.name, t.b, avg(t.v) FROM (
  SELECT s.worker_id, s.gpu, (s.ts / %(step)s) * %(step)s AS b, avg(s.value) AS v
  FROM metric_samples s
  WHERE s.worker_id = ANY(%(workers)s) AND s.metric = %(metric)s AND s.gpu = ANY(%(gpus)s)
    AND s.ts BETWEEN %(start)s AND %(end)s
  GROUP BY 1, 2, 3) t
JOIN workers w ON w.id = t.worker_id GROUP BY 1, 2 ORDER BY 1, 2
"""

BARE_RATE_BY_WORKER = """
SELECT w.name, t.b, sum(t.v) FROM (
  SELECT l.worker_id, l.gpu, (l.ts / %(step)s) * %(step)s AS b,
         sum(CASE WHEN l.value >= l.pv THEN l.value - l.pv ELSE l.value END) * 1000.0
           / sum(l.ts - l.pt) AS v
  FROM (
    SELECT s.worker_id, s.gpu, s.ts, s.value,
           lag(s.value) OVER (PARTITION BY s.worker_id, s.gpu ORDER BY s.ts) AS pv,
           lag(s.ts) OVER (PARTITION BY s.worker_id, s.gpu ORDER BY s.ts) AS pt
    FROM metric_samples s
    WHERE s.worker_id = ANY(%(workers)s) AND s.metric = %(metric)s AND s.gpu = -1
      AND s.ts BETWEEN %(start)s - %(lookback)s AND %(end)s) l
  WHERE l.pt IS NOT NULL AND l.ts >= %(start)s
  GROUP BY 1, 2, 3) t
JOIN workers w ON w.id = t.worker_id GROUP BY 1, 2 ORDER BY 1, 2
"""

BARE_ONE_GPU = """
SELECT (s.ts / %(step)s) * %(step)s AS b, avg(s.value) FROM metric_samples s
WHERE s.worker_id = %(worker)s AND s.metric = %(metric)s AND s.gpu = 0
  AND s.ts BETWEEN %(start)s AND %(end)s
GROUP BY 1 ORDER BY 1
"""


# Range queries are timed on one connection once it has run the statement this many times:
# psycopg prepares a statement on its fifth run and PostgreSQL may plan it once for all after
# five more, as a long-running server's pooled connections have them. The same for both.
WARM_RUNS = 10


async def time_ours(
    url: str,
    principal: Principal,
    now: datetime,
    params: RangeParams,
    repeat: int,
    retention: timedelta = timedelta(days=15),
) -> tuple[float, dict[str, Any]]:
    """The whole read: a session begun, the query, the session ended (its commit)."""
    db = Database.from_url(url, pool_size=1)
    times, answer = [], {}
    try:
        for _ in range(WARM_RUNS + repeat):
            start = time.perf_counter()
            async with db.read() as session:
                result = await metrics.range_query(
                    session, principal, params, now=now, retention=retention
                )
            times.append(time.perf_counter() - start)
            answer = result.to_json()
    finally:
        await db.dispose()
    return median(times[WARM_RUNS:]), answer


def time_bare(
    url: str, sql: str, args: dict[str, Any], repeat: int, *, prepare: bool | None = None
) -> tuple[float, list[Any]]:
    """The bare statement with psycopg, in a transaction of its own each time, committed;
    ``prepare=False``: parsed and planned each time, as a one-off statement is."""
    times, rows = [], []
    with psycopg.connect(url) as conn:
        for _ in range(WARM_RUNS + repeat):
            start = time.perf_counter()
            rows = conn.execute(sql, args, prepare=prepare).fetchall()
            conn.commit()
            times.append(time.perf_counter() - start)
    return median(times[WARM_RUNS:]), rows


async def time_session(url: str, sql: str, args: dict[str, Any], repeat: int) -> float:
    """The bare statement through the server's own read session (``Database.read``): what any
    read pays before its own work (a pooled connection and its check, BEGIN, COMMIT,
    SQLAlchemy's asyncio bridge)."""
    db = Database.from_url(url, pool_size=1)
    statement = text(re.sub(r"%\((\w+)\)s", r":\1", sql))
    times = []
    try:
        for _ in range(WARM_RUNS + repeat):
            start = time.perf_counter()
            async with db.read() as session:
                (await session.execute(statement, args)).all()
            times.append(time.perf_counter() - start)
    finally:
        await db.dispose()
    return median(times[WARM_RUNS:])


def bench_ranges(url: str, cluster: dict[str, Any], ticks: int, repeat: int) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        cluster_id, machine_id = conn.execute(
            "SELECT cluster_id, id FROM machines LIMIT 1"
        ).fetchone()
    workers = load_series(url, cluster["workspace"], cluster_id, machine_id, ticks)
    month = load_month(url, workers[0], machine_id, T0_MS + ticks * EVERY_MS)
    principal = Principal(
        0, None, "bench", cluster["organization"], "bench", cluster["workspace"], "default", False
    )
    end = T0_MS + ticks * EVERY_MS
    now = datetime.fromtimestamp(end / 1000, UTC)
    cases = {
        "gpu_mean_by_worker": (
            RangeParams(
                "task_gpu_utilization_ratio",
                match=("run:llama-sft",),
                by="worker",
                start=str(T0_MS),
                end=str(end),
            ),
            BARE_MEAN_BY_WORKER,
            {"metric": BY_NAME["task_gpu_utilization_ratio"].id, "gpus": list(range(16))},
            4 * 8 * ticks,
        ),
        "counter_rate_by_worker": (
            RangeParams(
                "task_network_receive_bytes_total",
                match=("run:llama-sft",),
                by="worker",
                rate="true",
                start=str(T0_MS),
                end=str(end),
            ),
            BARE_RATE_BY_WORKER,
            {"metric": BY_NAME["task_network_receive_bytes_total"].id, "lookback": 300_000},
            4 * ticks,
        ),
        "one_gpu_30_days": (
            RangeParams(
                "task_gpu_memory_used_bytes",
                match=("task:llama-sft-0", "gpu:0"),
                start=str(month),
                end=str(end),
            ),
            BARE_ONE_GPU,
            {"metric": BY_NAME["task_gpu_memory_used_bytes"].id, "worker": workers[0]},
            MONTH_SAMPLES,
        ),
        "one_gpu_last_hour": (
            RangeParams("task_gpu_utilization_ratio", match=("task:llama-sft-0", "gpu:0")),
            BARE_ONE_GPU,
            {"metric": BY_NAME["task_gpu_utilization_ratio"].id, "worker": workers[0]},
            360,
        ),
    }
    out: dict[str, Any] = {}
    for name, (params, sql, extra, scanned) in cases.items():
        # Raw samples kept 31 days here: the month reads its samples, as the bare SQL does.
        ours, answer = asyncio.run(
            time_ours(url, principal, now, params, repeat, retention=timedelta(days=31))
        )
        args = {
            "workers": workers,
            "start": answer["start"],
            "end": answer["end"],
            "step": answer["step"],
            **extra,
        }
        bare, rows = time_bare(url, sql, args, repeat)
        points = sum(len(s["points"]) for s in answer["series"])
        assert points == len(rows), (name, points, len(rows))
        out[name] = {
            "samples_read": scanned,
            "points": points,
            "step_ms": answer["step"],
            "ours_ms": ours * 1000,
            "bare_ms": bare * 1000,
            "ratio": ours / bare,
        }
        if name == "one_gpu_last_hour":  # a fixed cost: what it is made of
            one_off, _ = time_bare(url, sql, args, repeat, prepare=False)
            session = asyncio.run(time_session(url, sql, args, repeat))
            out[name] |= {"bare_one_off_ms": one_off * 1000, "bare_in_session_ms": session * 1000}
    return out


def bare_without_fk(url: str, placed: dict[int, list[int]], total: int, trials: int) -> float:
    """What the foreign key to workers costs: the same bare COPY once the key is dropped.
    Run last, on a database thrown away afterwards."""
    rows = resolved(url, machine_batches(placed, total, 10_000))
    n = sum(len(r) for r in rows)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE metric_samples DROP CONSTRAINT fk_metric_samples_worker_id_workers"
        )
    rates = []
    for _ in range(trials):
        empty_table(url)
        rates.append(n / bare_copy(url, rows))
    return median(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--ticks", type=int, default=31_250, help="range data: 10 s ticks")
    parser.add_argument("--only", choices=["ingest", "ranges"])
    args = parser.parse_args()
    with fresh_database() as url:
        cluster = populate(url, MACHINES, WORKERS_PER_MACHINE)
        ingest = {}
        if args.only in (None, "ingest"):
            ingest = {
                f"batch_{b}": bench_ingest(url, cluster["placed"], args.samples, b, args.trials)
                for b in (10_000, 1_000)
            }
            empty_table(url)
        ranges = {}
        if args.only in (None, "ranges"):
            ranges = bench_ranges(url, cluster, args.ticks, args.repeat)
        no_fk = None
        if args.only in (None, "ingest"):
            no_fk = bare_without_fk(url, cluster["placed"], args.samples, args.trials)
    save(
        "metrics_ingest" if args.only is None else f"metrics_{args.only}",
        {"ingest": ingest, "bare_copy_without_fk_samples_per_s": no_fk, "range": ranges},
    )
    for r in ingest.values():
        print(
            f"metrics ingest, {r['samples']:,} samples in batches of {r['batch']:,}: ingest() "
            f"{r['ingest_samples_per_s']:,.0f}/s, bare binary COPY "
            f"{r['bare_copy_samples_per_s']:,.0f}/s, ratio {r['ratio']:.2f} (target >= 0.5)"
        )
    if no_fk is not None:
        print(f"bare binary COPY without the foreign key to workers: {no_fk:,.0f}/s")
    for name, q in ranges.items():
        print(
            f"range query {name}: {q['samples_read']:,} samples -> {q['points']} points "
            f"(step {q['step_ms'] // 1000}s): range_query() {q['ours_ms']:.2f} ms, bare SQL "
            f"{q['bare_ms']:.2f} ms, ratio {q['ratio']:.2f}"
        )
        if "bare_one_off_ms" in q:
            print(
                f"  its fixed cost: the bare SQL parsed and planned each time (not prepared) "
                f"{q['bare_one_off_ms']:.2f} ms, ratio {q['ours_ms'] / q['bare_one_off_ms']:.2f} "
                f"(target <= 3); the bare SQL through the server's read session "
                f"{q['bare_in_session_ms']:.2f} ms, ratio "
                f"{q['ours_ms'] / q['bare_in_session_ms']:.2f}"
            )


if __name__ == "__main__":
    main()
