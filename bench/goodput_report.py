"""Goodput accounting's report (issue 5), beside a naive scan measured in the same run (figures
reported, never asserted; `python -m bench.goodput --only report`).

The report. goodput_hours holds 10 000 runs x 8 whole UTC days x 24 hours x 2 categories
(productive and idle, held), 3.84M run cells, and the workspace's cells; goodput_days their
sums by day; goodput_run_totals each run's running totals by hour (1.92M rows, as the tick
keeps them). ``reports.report(by="run")`` over the 7 days from 05:00 on day 1 to 05:00 on
day 8 (two rows of each run's totals: 04:00 on day 8 less 04:00 on day 1) against a naive
``SELECT … sum(gpu_seconds) FROM goodput_hours … GROUP BY`` over the same 168 hours, plus the
runs' names, in the same process (its garbage collector set as the server sets it). Target:
the report at most a fifth of the naive scan.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import psycopg

from backend.accounting import ledger_queries, ledger_writes, reports
from backend.accounting.rules import Category, Period
from backend.accounting.viewers import Viewer
from backend.db import Database
from backend.jobs.runtime import freeze_what_started
from backend.models.goodput import TOTAL_COLUMNS
from bench.common import Timer, median, tenancy
from bench.goodput_data import (
    CELL,
    DAY1,
    GPUS,
    LEDGER_TYPES,
    T0,
    FixedClock,
    copy_runs,
)


def populate_ledgers(url: str, runs: int, days: int, day1: datetime = DAY1) -> dict[str, Any]:
    """``runs`` runs with ``days`` whole days of hourly cells each from ``day1`` (productive and
    idle, held), their workspace's cells, and the daily cells summed from the hours."""
    rng = random.Random(11)
    per_hour = 10 * GPUS * 3600.0  # a run of 10 workers of 8 GPUs
    with psycopg.connect(url) as conn:
        org, cluster, ws = tenancy(conn, T0)
        run_ids = copy_runs(conn, cluster, ws, runs, 10)
        hours = [day1 + timedelta(hours=h) for h in range(days * 24)]
        statement = f"COPY goodput_hours (hour, {CELL}, gpu_seconds) FROM STDIN (FORMAT BINARY)"
        with conn.cursor().copy(statement) as copy:
            copy.set_types(LEDGER_TYPES)
            for hour in hours:  # hour after hour, as the tick writes them
                for run_id in run_ids:
                    productive = per_hour * rng.random()
                    copy.write_row(
                        (hour, ws, cluster, "run", run_id, "productive", True, productive)
                    )
                    copy.write_row(
                        (hour, ws, cluster, "run", run_id, "idle", True, per_hour - productive)
                    )
        conn.execute(
            f"INSERT INTO goodput_hours (hour, {CELL}, gpu_seconds) "
            "SELECT hour, workspace_id, cluster_id, 'workspace', workspace_id, category, held, "
            "sum(gpu_seconds) FROM goodput_hours WHERE scope = 'run' "
            "GROUP BY hour, workspace_id, cluster_id, category, held"
        )
        conn.execute(
            f"INSERT INTO goodput_days (day, {CELL}, gpu_seconds) "
            f"SELECT date_trunc('day', hour, 'UTC'), {CELL}, sum(gpu_seconds) "
            f"FROM goodput_hours GROUP BY 1, {CELL}"
        )
        conn.execute(RUN_TOTALS)
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
        counts = {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("goodput_hours", "goodput_days", "goodput_run_totals")
        }
    return {"workspace": ws, "organization": org, "runs": len(run_ids), **counts}


# The runs' running totals as the tick keeps them (every run has cells every hour here): by
# run and hour, the sums of its cells up to that hour, the latest marked last.
_RUNNING = ", ".join(f"sum({c}) OVER (PARTITION BY scope_id ORDER BY hour)" for c in TOTAL_COLUMNS)
RUN_TOTALS = f"""
INSERT INTO goodput_run_totals (run_id, hour, workspace_id, cluster_id, last,
  {", ".join(TOTAL_COLUMNS)})
SELECT scope_id, hour, workspace_id, cluster_id, hour = max(hour) OVER (PARTITION BY scope_id),
  {_RUNNING}
FROM (
  SELECT scope_id, hour, workspace_id, cluster_id, {ledger_writes.RUN_CELL_SUMS}
  FROM goodput_hours WHERE scope = 'run'
  GROUP BY scope_id, hour, workspace_id, cluster_id
) AS cells
ORDER BY hour, scope_id
"""

NAIVE = """
SELECT scope_id, category, held, sum(gpu_seconds) FROM goodput_hours
WHERE scope = 'run' AND workspace_id = %(ws)s AND hour >= %(start)s AND hour < %(end)s
GROUP BY scope_id, category, held
"""


def naive(url: str, ws: int, period: Period, repeat: int) -> tuple[list[float], dict[str, float]]:
    """The hourly ledger scanned and summed, and the runs' names: bare psycopg."""
    times, per_run = [], {}
    with psycopg.connect(url) as conn:
        for _ in range(repeat + 1):  # the first warms the cache
            start = time.perf_counter()
            rows = conn.execute(NAIVE, {"ws": ws, "start": period.start, "end": period.end})
            sums = rows.fetchall()
            ids = list({r[0] for r in sums})
            names = dict(conn.execute("SELECT id, name FROM runs WHERE id = ANY(%s)", (ids,)))
            times.append(time.perf_counter() - start)
            conn.rollback()
            per_run = defaultdict(float)
            for scope_id, category, held, seconds in sums:
                per_run[f"{names[scope_id]} {category} {held}"] += seconds
    return times[1:], dict(per_run)


async def ours(
    url: str, ws: int, period: Period, repeat: int
) -> tuple[list[float], dict[str, float]]:
    db = Database.from_url(url, pool_size=1)
    times, per_run = [], {}
    try:
        for _ in range(repeat + 1):
            async with db.read() as session:
                start = time.perf_counter()
                report = await reports.report(session, Viewer([ws]), "run", period)
                times.append(time.perf_counter() - start)
            per_run = {
                f"{row.name} {c.value} {held}": seconds
                for row in report.rows
                for held, part in ((True, row.ledger.held), (False, row.ledger.not_held))
                for c, seconds in part.items()
                if c in (Category.PRODUCTIVE, Category.IDLE)
            }
    finally:
        await db.dispose()
    return times[1:], per_run


def bench_report(url: str, runs: int, repeat: int) -> dict[str, Any]:
    with Timer() as fill:
        data = populate_ledgers(url, runs, days=8)
    # as the server does once started (the naive scan, in this process too, gains as well)
    freeze_what_started()
    period = Period(DAY1 + timedelta(hours=5), DAY1 + timedelta(days=7, hours=5))
    report_times, by_report = asyncio.run(ours(url, data["workspace"], period, repeat))
    naive_times, by_naive = naive(url, data["workspace"], period, repeat)
    report_s, naive_s = median(report_times), median(naive_times)
    differ = sum(
        1
        for k in by_report.keys() | by_naive.keys()
        if abs(by_report.get(k, 0.0) - by_naive.get(k, 0.0)) > 1e-6 * max(1.0, by_naive.get(k, 0))
    )
    return {
        **data,
        "fill_seconds": fill.seconds,
        "period": [period.start, period.end],
        "report_seconds": report_s,
        "naive_seconds": naive_s,
        "ratio": report_s / naive_s,
        "total_report_gpu_hours": sum(by_report.values()) / 3600,
        "total_naive_gpu_hours": sum(by_naive.values()) / 3600,
        "run_figures_that_differ": differ,
        "trials": {"report": report_times, "naive": naive_times},
        "page": bench_page(url, data, repeat),
    }


# -- the goodput page's GraphQL query -------------------------------------------------------------

PAGE = """query($start: DateTime!, $end: DateTime!) {
  goodput(by: RUN, start: $start, end: $end) {
    rows { name ledger { allocatedGpuHours productiveGpuHours lostGpuHours waitingGpuHours
      goodput gpuHours { category gpuHours heldGpuHours } biggestLoss { category gpuHours } } }
    total { allocatedGpuHours productiveGpuHours lostGpuHours waitingGpuHours goodput }
  }
}"""


# The page's chart: the workspace's ledger hour by hour (issue 23), as the console asks it.
SERIES = """query($start: DateTime!, $end: DateTime!) {
  goodputSeries(by: WORKSPACE, name: "default", start: $start, end: $end, step: HOUR) {
    points { start end ledger { allocatedGpuHours waitingGpuHours goodput
      gpuHours { category heldGpuHours } } }
  }
}"""

SERIES_BARE = """
SELECT hour, category, held, sum(gpu_seconds) FROM goodput_hours
WHERE scope = 'workspace' AND scope_id = %(ws)s AND workspace_id = %(ws)s
  AND hour >= %(start)s AND hour < %(end)s
GROUP BY hour, category, held ORDER BY hour
"""


async def page(url: str, ws: int, org: int, period: Period, repeat: int) -> list[float]:
    """The console's goodput page by run: its GraphQL queries (the report, and the chart's
    series) through the schema, the answers serialised to JSON as the server sends them."""
    from backend.access.rules import Principal
    from backend.request.context import Context
    from backend.resolvers.root import schema

    db = Database.from_url(url, pool_size=1)
    principal = Principal(0, None, "bench", org, "bench", ws, "default", False)
    variables = {"start": period.start.isoformat(), "end": period.end.isoformat()}
    times = []
    try:
        for _ in range(repeat + 1):
            context = Context(db, FixedClock(period.end), principal, None)
            start = time.perf_counter()
            result = await schema.execute(PAGE, variables, context_value=context)
            body = json.dumps({"data": result.data})
            chart = await schema.execute(SERIES, variables, context_value=context)
            body += json.dumps({"data": chart.data})
            times.append(time.perf_counter() - start)
            assert result.errors is None and chart.errors is None, (result.errors, chart.errors)
            assert len(result.data["goodput"]["rows"]) > 0 and body  # type: ignore[index]
            assert len(chart.data["goodputSeries"]["points"]) == 7 * 24  # type: ignore[index]
    finally:
        await db.dispose()
    return times[1:]


def page_bare(url: str, ws: int, period: Period, repeat: int) -> list[float]:
    """The statements behind the page, bare: compiled once, run with psycopg, the rows
    fetched and serialised (the report's, and the series' cells summed by hour)."""
    from sqlalchemy.dialects import postgresql

    statement = ledger_queries.named_ledgers_query("run", period.start, period.end, [ws], None)
    sql = str(
        statement.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
    )
    times = []
    with psycopg.connect(url) as conn:
        for _ in range(repeat + 1):
            start = time.perf_counter()
            rows = conn.execute(sql).fetchall()
            json.dumps([list(r) for r in rows])
            params = {"ws": ws, "start": period.start, "end": period.end}
            cells = conn.execute(SERIES_BARE, params).fetchall()
            json.dumps([[str(c[0]), *c[1:]] for c in cells])
            times.append(time.perf_counter() - start)
            conn.rollback()
    return times[1:]


def bench_page(url: str, data: dict[str, Any], repeat: int) -> dict[str, Any]:
    period = Period(DAY1 + timedelta(hours=5), DAY1 + timedelta(days=7, hours=5))
    ours_s = median(asyncio.run(page(url, data["workspace"], data["organization"], period, repeat)))
    bare_s = median(page_bare(url, data["workspace"], period, repeat))
    return {"page_seconds": ours_s, "bare_seconds": bare_s, "ratio": ours_s / bare_s}


def print_report(r: dict[str, Any]) -> None:
    print(
        f"goodput report by run, 7 days (two rows of each run's running totals) over "
        f"{r['runs']:,} runs ({r['goodput_hours']:,} hourly and {r['goodput_days']:,} daily "
        f"cells, {r['goodput_run_totals']:,} rows of running totals): "
        f"report() {r['report_seconds'] * 1000:.0f} ms, naive scan of the hours + names "
        f"{r['naive_seconds'] * 1000:.0f} ms, ratio {r['ratio']:.2f} (target <= 0.2); "
        f"totals {r['total_report_gpu_hours']:,.1f} vs {r['total_naive_gpu_hours']:,.1f} "
        f"GPU-hours, run figures that differ: {r['run_figures_that_differ']}"
    )
    p = r["page"]
    print(
        f"the goodput page's GraphQL queries by run and the chart's series (7 days, "
        f"{r['runs']:,} runs, JSON out): "
        f"{p['page_seconds'] * 1000:.0f} ms, their statements bare with psycopg "
        f"{p['bare_seconds'] * 1000:.0f} ms, ratio {p['ratio']:.2f} (target <= 2)"
    )
