"""Goodput accounting's tick (issue 5), beside a bare baseline measured in the same run (figures
reported, never asserted; `python -m bench.goodput --only tick`).

The tick. 10 000 runs x 10 workers of 8 GPUs (100 000 workers) placed on 1 000 machines (nine
in ten of them in one of 10 pools), every worker waiting at T0, starting at T0+1 min, running
from T0+2 min (state_transitions, all accounted), one utilisation sample per worker's GPU 0
and minute (about 80% of the minutes >= 0.05). ``counting.tick()`` counts the minute
[T, T+1 min) with the clock at T+1 min 5 s, in one transaction, commit included; the mark
(accounting_marks.counted_until) is put back to T and what the tick wrote is put back between
trials. Two cases:

* later: the hour's cells are already in the ledgers (the previous minute was counted): the
  upserts update, as 59 ticks of every 60 do;
* first: the ledgers hold nothing of the hour (its first minute): the upserts insert.

The baseline is one hand-written set-based PostgreSQL statement on the same state: the phase
in force at T of every worker (DISTINCT ON), its minute's mean utilisation, the category
(running: productive at >= 0.05, else idle; the other phases by the same table as rules.py),
the cells of the run, workspace, machine and pool scopes, and ``INSERT … ON CONFLICT DO
UPDATE`` into goodput_hours and goodput_days (the ledgers the tick writes). It knows that no
worker changes phase inside the minute, which is this data's state. A second variant also
inserts the intervals (goodput_intervals), which the tick writes too. Both ledgers are
compared cell by cell after every trial. Neither bare statement keeps the runs' running
totals (goodput_run_totals), which the tick's statement moves on with its cells, nor looks for
workers winding down or deleted without their time counted, which the tick does in the same
scan: the tick's ratio includes that work, the baseline does not.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import random
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg

from backend.accounting import counting, ledger_writes, repository
from backend.accounting.rules import BUSY_UTILIZATION
from backend.db import Database
from backend.metrics.rules import ROW_COLUMNS
from bench.common import Timer, median, tenancy
from bench.goodput_data import (
    BUSY_SHARE,
    CELL,
    GPUS,
    LEDGERS,
    MINUTE,
    POOLS,
    PRIME,
    SAMPLE_TYPES,
    T0,
    UTILIZATION,
    FixedClock,
    T,
    copy_runs,
)


def populate_tick(url: str, runs: int, per_run: int, machines: int) -> dict[str, Any]:
    """The live cluster of the tick, written with COPY, then analysed."""
    rng = random.Random(5)
    with psycopg.connect(url) as conn:
        cluster, ws = tenancy(conn, T0)[1:]
        pools = [
            conn.execute(
                "INSERT INTO pools (cluster_id, name, created_at) VALUES (%s, %s, %s) RETURNING id",
                (cluster, f"pool-{p}", T0),
            ).fetchone()[0]  # type: ignore[index]
            for p in range(POOLS)
        ]
        lease = T0 + timedelta(days=1)
        with conn.cursor().copy(
            "COPY machines (cluster_id, pool_id, name, cpu_cores, memory_bytes, state, reason, "
            "labels, lease_expires_at, last_seen_at, created_at) FROM STDIN"
        ) as copy:
            for m in range(machines):
                pool = pools[m % POOLS] if m % 10 != 9 else None  # one in ten in no pool
                copy.write_row(
                    (
                        cluster,
                        pool,
                        f"gpu-{m:05d}",
                        128.0,
                        2**40,
                        "ready",
                        "Registered",
                        "{}",
                        lease,
                        T0,
                        T0,
                    )
                )
        machine_ids = [r[0] for r in conn.execute("SELECT id FROM machines ORDER BY id")]
        run_ids = copy_runs(conn, cluster, ws, runs, per_run)
        with conn.cursor().copy(
            "COPY workers (run_id, rank, name, state, reason, state_since, machine_id, gpu_ids, "
            "gpus, attempt, restarts, ready, phase, created_at) FROM STDIN"
        ) as copy:
            for r, run_id in enumerate(run_ids):
                for rank in range(per_run):
                    machine = machine_ids[(r * per_run + rank) % machines]
                    copy.write_row(
                        (
                            run_id,
                            rank,
                            f"run-{r:05d}-{rank}",
                            "Running",
                            "Running",
                            T0 + 2 * MINUTE,
                            machine,
                            "[0,1,2,3,4,5,6,7]",
                            GPUS,
                            1,
                            0,
                            True,
                            "running",
                            T0,
                        )
                    )
        workers = conn.execute("SELECT id, run_id, machine_id FROM workers ORDER BY id").fetchall()
        names: dict[int, str] = dict(conn.execute("SELECT id, name FROM workers").fetchall())
        with conn.cursor().copy(
            "COPY state_transitions (run_id, worker_id, transition_at, state, reason, phase, "
            "held_gpus, gpus, machine_id, accounted) FROM STDIN"
        ) as copy:
            for worker_id, run_id, machine in workers:
                copy.write_row(
                    (run_id, worker_id, T0, "Pending", "Waiting", "waiting", 0, GPUS, None, True)
                )
                copy.write_row(
                    (
                        run_id,
                        worker_id,
                        T0 + MINUTE,
                        "Starting",
                        "Placed",
                        "starting",
                        GPUS,
                        GPUS,
                        machine,
                        True,
                    )
                )
                copy.write_row(
                    (
                        run_id,
                        worker_id,
                        T0 + 2 * MINUTE,
                        "Running",
                        "Running",
                        "running",
                        GPUS,
                        GPUS,
                        machine,
                        True,
                    )
                )
        statement = f"COPY metric_samples ({', '.join(ROW_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
        with conn.cursor().copy(statement) as copy:
            copy.set_types(SAMPLE_TYPES)
            for minute in (PRIME, T):
                at = int((minute + timedelta(seconds=30)).timestamp() * 1000)
                for worker_id, _, machine in workers:
                    busy = rng.random() < BUSY_SHARE
                    value = rng.uniform(0.3, 1.0) if busy else rng.uniform(0.0, 0.04)
                    copy.write_row((worker_id, at, value, machine, UTILIZATION, 0))
        # What the ticks up to PRIME left: every worker's open interval (running, from when it
        # started running), the mark at PRIME.
        pool_of: dict[int, int | None] = dict(
            conn.execute("SELECT id, pool_id FROM machines").fetchall()
        )
        with conn.cursor().copy(
            "COPY goodput_open_intervals (worker_id, worker_name, run_id, workspace_id, "
            "cluster_id, phase, gpus, phase_machine_id, start_at, category, held, machine_id, "
            "pool_id) FROM STDIN"
        ) as copy:
            for worker_id, run_id, machine in workers:
                copy.write_row(
                    (
                        worker_id,
                        names[worker_id],
                        run_id,
                        ws,
                        cluster,
                        "running",
                        GPUS,
                        machine,
                        T0 + 2 * MINUTE,
                        "productive",
                        True,
                        machine,
                        pool_of[machine],
                    )
                )
        conn.execute(
            "INSERT INTO accounting_marks (id, counted_until, ticked_at) VALUES (1, %s, NULL)",
            (PRIME,),
        )
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
    return {"cluster": cluster, "workspace": ws, "workers": len(workers), "runs": len(run_ids)}


# -- the bare baseline ---------------------------------------------------------------------------

# rules.py's table: the category and held flag of every phase but running (by utilisation).
PHASES = """(VALUES ('waiting', 'waiting', false), ('starting', 'starting', true),
  ('restart', 'restart', true), ('stalled', 'stalled', true),
  ('stopping:owner', 'productive', true), ('stopping:time_limit', 'productive', true),
  ('stopping:preemption', 'preemption', true), ('stopping:stall', 'stalled', true),
  ('stopping:failure', 'failure', true), ('requeued:failure', 'failure', false),
  ('requeued:preemption', 'preemption', false), ('requeued:stall', 'stalled', false),
  ('running', NULL, true)) AS p(phase, category, held)"""


def bare_statement(intervals: bool) -> str:
    """Classify every worker's minute and upsert the hourly and daily cells: one statement."""
    upsert = """INSERT INTO {table} ({time}, {cell}, gpu_seconds)
  SELECT %(hour)s::timestamptz, {cell}, gpu_seconds FROM cells
  ON CONFLICT ({time}, {cell}) DO UPDATE SET gpu_seconds = {table}.gpu_seconds
    + excluded.gpu_seconds"""
    written = (
        """, intervals AS (
  INSERT INTO goodput_intervals (worker_id, worker_name, run_id, workspace_id, cluster_id,
    machine_id, pool_id, start_at, end_at, category, held, gpus)
  SELECT worker_id, worker_name, run_id, workspace_id, cluster_id, machine_id, pool_id,
    %(start)s, %(end)s, category, held, gpus FROM counted)"""
        if intervals
        else ""
    )
    return f"""
WITH in_force AS (
  SELECT DISTINCT ON (t.worker_id) t.worker_id, t.phase, t.gpus, t.machine_id
  FROM state_transitions t
  WHERE t.worker_id IS NOT NULL AND t.phase IS NOT NULL AND t.transition_at <= %(start)s
  ORDER BY t.worker_id, t.transition_at DESC, t.id DESC
), busy AS (
  SELECT s.worker_id, avg(s.value) AS mean FROM metric_samples s
  WHERE s.metric = %(metric)s AND s.ts >= %(start_ms)s AND s.ts < %(end_ms)s
  GROUP BY s.worker_id
), counted AS (
  SELECT f.worker_id, w.name AS worker_name, w.run_id, r.workspace_id, r.cluster_id,
    CASE WHEN p.held THEN f.machine_id END AS machine_id,
    CASE WHEN p.held THEN m.pool_id END AS pool_id,
    coalesce(p.category, CASE WHEN b.mean >= %(busy)s THEN 'productive' ELSE 'idle' END)
      AS category,
    p.held, f.gpus, f.gpus * %(seconds)s AS gpu_seconds
  FROM in_force f
  JOIN {PHASES} ON p.phase = f.phase
  JOIN workers w ON w.id = f.worker_id
  JOIN runs r ON r.id = w.run_id
  LEFT JOIN machines m ON m.id = f.machine_id
  LEFT JOIN busy b ON b.worker_id = f.worker_id
  WHERE f.gpus > 0
), cells AS (
  SELECT c.workspace_id, c.cluster_id, x.scope, x.scope_id, c.category, c.held,
    sum(c.gpu_seconds) AS gpu_seconds
  FROM counted c CROSS JOIN LATERAL (VALUES ('run', c.run_id), ('workspace', c.workspace_id),
    ('machine', c.machine_id), ('pool', c.pool_id)) AS x(scope, scope_id)
  WHERE x.scope_id IS NOT NULL
  GROUP BY 1, 2, 3, 4, 5, 6
), hours AS (
  {upsert.format(table="goodput_hours", time="hour", cell=CELL)}
){written}
{upsert.format(table="goodput_days", time="day", cell=CELL).replace("%(hour)s", "%(day)s")}
"""


MARK = "UPDATE accounting_marks SET counted_until = %(end)s, ticked_at = %(now)s WHERE id = 1"


def bare(url: str, start: datetime, intervals: bool) -> float:
    end = start + MINUTE
    args = {
        "start": start,
        "end": end,
        "hour": start.replace(minute=0, second=0, microsecond=0),
        "day": start.replace(hour=0, minute=0, second=0, microsecond=0),
        "now": end + timedelta(seconds=5),
        "start_ms": int(start.timestamp() * 1000),
        "end_ms": int(end.timestamp() * 1000),
        "metric": UTILIZATION,
        "busy": BUSY_UTILIZATION,
        "seconds": (end - start).total_seconds(),
    }
    assert start.hour == end.hour or end.minute == 0, "one hour's cells only"
    statement = bare_statement(intervals)
    with psycopg.connect(url) as conn, Timer() as t:
        conn.execute(statement, args)
        conn.execute(MARK, args)
        conn.commit()
    return t.seconds


# -- the tick ------------------------------------------------------------------------------------


async def tick(db: Database, now: datetime) -> tuple[float, float, counting.TickResult]:
    """One tick in its own transaction: (seconds with the commit, of which commit, result)."""
    start = time.perf_counter()
    async with db.transaction() as session:
        result = await counting.tick(session, FixedClock(now))
        committing = time.perf_counter()
    end = time.perf_counter()
    return end - start, end - committing, result


TIMED = (
    (repository, "lock_mark"),
    (repository, "unaccounted"),
    (repository, "orphans"),
    (ledger_writes, "count_steady_minute"),
    (repository, "open_intervals"),
    (repository, "mark_accounted"),
)


@contextlib.contextmanager
def timing_repository(times: dict[str, float]) -> Iterator[None]:
    """Time the tick's SQL (repository and ledger_writes functions, row decoding included) by
    function."""
    originals = {(module, name): getattr(module, name) for module, name in TIMED}

    def wrap(name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            key = f"{name} {args[1].__tablename__}" if name == "_upsert" else name
            start = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                times[key] += time.perf_counter() - start

        return timed

    for (module, name), fn in originals.items():
        setattr(module, name, wrap(name, fn))
    try:
        yield
    finally:
        for (module, name), fn in originals.items():
            setattr(module, name, fn)


def snapshot(url: str) -> None:
    """Keep the ledgers as they are now (the previous minute counted) to put them back."""
    with psycopg.connect(url, autocommit=True) as conn:
        for table in LEDGERS:
            conn.execute(f"DROP TABLE IF EXISTS bench_{table}")
            conn.execute(f"CREATE TABLE bench_{table} AS SELECT * FROM {table}")


def reset(url: str, case: str) -> None:
    """The state before the timed minute: the hour's earlier cells (later) or none (first)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(LEDGERS)}")
        # The open intervals are always as the counted minute left them; the ledgers' cells of
        # the hour too, or none.
        for table in LEDGERS if case == "later" else ["goodput_open_intervals"]:
            conn.execute(f"INSERT INTO {table} SELECT * FROM bench_{table}")
        conn.execute("UPDATE accounting_marks SET counted_until = %s, ticked_at = NULL", (T,))
        conn.execute(f"VACUUM ANALYZE {', '.join(LEDGERS)}, accounting_marks")
        conn.execute("CHECKPOINT")


def ledgers(url: str, tick: bool) -> dict[str, dict[tuple[Any, ...], float]]:
    out: dict[str, dict[tuple[Any, ...], float]] = {}
    with psycopg.connect(url) as conn:
        for table, time_ in (("goodput_hours", "hour"), ("goodput_days", "day")):
            rows = conn.execute(f"SELECT {time_}, {CELL}, gpu_seconds FROM {table}").fetchall()
            out[table] = {tuple(r[:-1]): r[-1] for r in rows}
        # The timed minute as the intervals explain it, closed and open (to the mark) alike;
        # the bare statement writes the minute's intervals whole.
        out["goodput_intervals"] = {
            tuple(r[:-1]): r[-1]
            for r in conn.execute(
                """SELECT category, held, count(*),
                     sum(gpus * extract(epoch FROM least(end_at, %(end)s)
                       - greatest(start_at, %(start)s)))
                   FROM (SELECT category, held, gpus, start_at, end_at FROM goodput_intervals
                         UNION ALL
                         SELECT o.category, o.held, o.gpus, o.start_at, m.counted_until
                         FROM goodput_open_intervals o, accounting_marks m
                         WHERE %(tick)s) i
                   WHERE end_at > %(start)s AND start_at < %(end)s GROUP BY 1, 2""",
                {"start": T, "end": T + MINUTE, "tick": tick},
            )
        }
    return out


def differences(a: dict[tuple[Any, ...], float], b: dict[tuple[Any, ...], float]) -> int:
    keys = a.keys() | b.keys()
    return sum(1 for k in keys if k not in a or k not in b or abs(a[k] - b[k]) > 1e-6)


def by_scope(cells: dict[tuple[Any, ...], float]) -> dict[str, dict[str, float]]:
    """GPU-seconds by scope and category: the ledger's totals."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (_, _, _, scope, _, category, _), seconds in cells.items():
        out[scope][category] += seconds
    return {s: dict(c) for s, c in sorted(out.items())}


async def bench_tick(url: str, trials: int, profile: bool) -> dict[str, Any]:
    db = Database.from_url(url, pool_size=1)
    try:
        # The minute before the timed one, counted by the tick into empty ledgers: the hour's
        # cells exist afterwards, and the engine's statements are compiled (a warm server).
        prime, _, primed = await tick(db, PRIME + MINUTE + timedelta(seconds=5))
        snapshot(url)
        cases: dict[str, Any] = {}
        for case in ("later", "first"):
            ours: list[float] = []
            commits: list[float] = []
            bares: dict[str, list[float]] = {"ledgers": [], "with_intervals": []}
            states: dict[str, list[dict[str, dict[tuple[Any, ...], float]]]] = defaultdict(list)
            intervals = 0
            for trial in range(trials):
                # Alternate who goes first, so neither always meets the warmer cache.
                order = ["tick", "ledgers", "with_intervals"]
                for who in order if trial % 2 == 0 else order[::-1]:
                    reset(url, case)
                    if who == "tick":
                        seconds, commit, result = await tick(db, T + MINUTE + timedelta(seconds=5))
                        assert result.counted_from == T, result
                        ours.append(seconds)
                        commits.append(commit)
                        intervals = result.intervals
                    else:
                        bares[who].append(bare(url, T, intervals=who == "with_intervals"))
                    states[who].append(ledgers(url, tick=who == "tick"))
            reference = states["tick"][0]
            check = {
                f"{who} {table}": max(differences(reference[table], s[table]) for s in runs)
                for who, runs in states.items()
                for table in ("goodput_hours", "goodput_days")
            }
            check["with_intervals goodput_intervals"] = max(
                differences(reference["goodput_intervals"], s["goodput_intervals"])
                for s in states["with_intervals"]
            )
            cases[case] = {
                "tick_seconds": median(ours),
                "tick_min_seconds": min(ours),
                "tick_commit_seconds": median(commits),
                "bare_seconds": median(bares["ledgers"]),
                "bare_with_intervals_seconds": median(bares["with_intervals"]),
                "ratio": median(ours) / median(bares["ledgers"]),
                "ratio_to_bare_with_intervals": median(ours) / median(bares["with_intervals"]),
                "intervals_written": intervals,
                "hour_cells": len(reference["goodput_hours"]),
                "cells_that_differ": check,
                "totals_tick": by_scope(reference["goodput_hours"]),
                "totals_bare": by_scope(states["ledgers"][0]["goodput_hours"]),
                "trials": {"tick": ours, "commit": commits, **bares},
            }
        reset(url, "later")
        times: dict[str, float] = defaultdict(float)
        with timing_repository(times):
            total, commit, _ = await tick(db, T + MINUTE + timedelta(seconds=5))
        breakdown = {k: v for k, v in sorted(times.items(), key=lambda kv: -kv[1])}
        breakdown["commit"] = commit
        breakdown["python: intervals, cells, days (the rest)"] = total - sum(breakdown.values())
        breakdown["total"] = total
        profiled = ""
        if profile:
            reset(url, "later")
            profiler = cProfile.Profile()
            profiler.enable()
            await tick(db, T + MINUTE + timedelta(seconds=5))
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
            profiled = out.getvalue()
        return {
            "prime_tick_seconds": prime,
            "prime_intervals": primed.intervals,
            "cases": cases,
            "breakdown_later_seconds": breakdown,
            "profile": profiled,
        }
    finally:
        await db.dispose()


def print_tick(r: dict[str, Any], workers: int, target: str) -> None:
    print(
        f"goodput tick, {workers:,} running workers of 8 GPUs, one minute "
        f"(the primed minute before it: {r['prime_tick_seconds']:.2f} s)"
    )
    print(
        f"  {'case':<7} {'tick s (min)':>14} {'bare s':>8} {'ratio':>6} {'bare+int s':>11} "
        f"{'ratio':>6}  {'cells':>6}  cells that differ from the tick's"
    )
    for case, c in r["cases"].items():
        differ = ", ".join(f"{k} {v}" for k, v in c["cells_that_differ"].items() if v) or "none"
        print(
            f"  {case:<7} {c['tick_seconds']:>7.2f} ({c['tick_min_seconds']:.2f}) "
            f"{c['bare_seconds']:>8.2f} {c['ratio']:>6.2f} "
            f"{c['bare_with_intervals_seconds']:>11.2f} "
            f"{c['ratio_to_bare_with_intervals']:>6.2f}  {c['hour_cells']:>6}  {differ}"
        )
    for who in ("tick", "bare"):
        totals = r["cases"]["first"][f"totals_{who}"]
        line = ", ".join(
            f"{scope} " + "/".join(f"{v / 3600:,.0f}" for _, v in sorted(cats.items()))
            for scope, cats in totals.items()
        )
        print(f"  the minute's GPU-hours (idle/productive) by scope, {who}: {line}")
    print("  where a later tick's time goes:")
    for part, seconds in r["breakdown_later_seconds"].items():
        print(f"    {part:<45} {seconds:7.3f} s")
    print(f"  target: {target}")
