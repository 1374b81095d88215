"""One scheduling pass: 10 000 pending runs over 2 000 machines of 8 GPUs (issue 3).

Reported beside a bare baseline measured in the same run: the plain psycopg reads of the
same inputs (pending runs, machines, GPUs, placed workers), so the figure says what the pass
adds to just reading what it decides from. Four passes: the first over the fresh queue (it
places 1 348 gangs and writes every other run's reason), the next (it plans again: the first
changed its own inputs), one with nothing new (it reads the digest of its inputs and stops),
and one after a run more was submitted. Beside them, not a target: what the first pass wrote,
written again by plain psycopg (its floor, with the reads, for a pass that writes as much).

    python -m bench.scheduling_pass [--runs 10000] [--machines 2000] [--trials 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from backend.db import Database
from backend.jobs.runtime import freeze_what_started
from backend.scheduling import service as scheduling
from backend.spec import parse_spec
from bench.common import Timer, fresh_database, median, save, tenancy

T0 = datetime(2026, 10, 1, tzinfo=UTC)
GIB = 2**30


class Clock:
    def now(self) -> datetime:
        return T0 + timedelta(hours=1)


def populate(url: str, runs: int, machines: int, seed: int = 7) -> None:
    """Rows as the services write them, inserted with COPY for speed."""
    rng = random.Random(seed)
    with psycopg.connect(url) as conn:
        _, cluster, ws = tenancy(conn, T0)
        lease = T0 + timedelta(days=365)
        with conn.cursor().copy(
            "COPY machines (cluster_id, name, cpu_cores, memory_bytes, state, reason, labels, "
            "lease_expires_at, last_seen_at, created_at) FROM STDIN"
        ) as copy:
            for m in range(machines):
                copy.write_row(
                    (
                        cluster,
                        f"gpu-{m:05d}",
                        128.0,
                        1024 * GIB,
                        "ready",
                        "Registered",
                        "{}",
                        lease,
                        T0,
                        T0,
                    )
                )
        ids = [r[0] for r in conn.execute("SELECT id FROM machines ORDER BY id")]
        with conn.cursor().copy(
            "COPY gpus (machine_id, index, uuid, model, memory_bytes, health, health_reason) "
            "FROM STDIN"
        ) as copy:
            for mid in ids:
                for i in range(8):
                    copy.write_row(
                        (mid, i, f"GPU-{mid}-{i}", "NVIDIA H100 80GB HBM3", 80 * GIB, "ok", "")
                    )
        shapes = []
        with conn.cursor().copy(
            "COPY runs (workspace_id, cluster_id, name, spec, priority, worker_count, "
            "gpus_per_worker, state, reason, state_since, created_at, attempt, failures_in_row) "
            "FROM STDIN"
        ) as copy:
            for r in range(runs):
                workers = rng.choice([1, 1, 1, 2, 2, 4, 8])
                gpus = rng.choice([1, 2, 4, 8, 8])
                priority = rng.choice([10, 50, 50, 50, 90])
                # Stored as the server stores one: the whole checked specification.
                spec = parse_spec(
                    {
                        "name": f"run-{r}",
                        "workers": workers,
                        "gpus": gpus,
                        "cpu": 8.0,
                        "memory_bytes": 64 * GIB,
                        "command": ["python", "train.py"],
                        "restart_policy": "on_failure",
                        "max_restarts": 10,
                    }
                ).to_json() | {"cluster": "local", "pool": None}
                shapes.append(workers)
                copy.write_row(
                    (
                        ws,
                        cluster,
                        f"run-{r}",
                        json.dumps(spec),
                        priority,
                        workers,
                        gpus,
                        "Pending",
                        "Run created",
                        T0,
                        T0 + timedelta(seconds=r),
                        0,
                        0,
                    )
                )
        run_ids = [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY id")]
        with conn.cursor().copy(
            "COPY workers (run_id, rank, name, state, reason, state_since, gpu_ids, gpus, "
            "attempt, restarts, ready, phase, created_at) FROM STDIN"
        ) as copy:
            for rid, workers, r in zip(run_ids, shapes, range(runs), strict=True):
                for rank in range(workers):
                    copy.write_row(
                        (
                            rid,
                            rank,
                            f"run-{r}-{rank}",
                            "Pending",
                            "Waiting to be placed with its gang",
                            T0,
                            "[]",
                            0,
                            0,
                            0,
                            False,
                            "waiting",
                            T0,
                        )
                    )
        conn.execute(
            "UPDATE workers w SET gpus = r.gpus_per_worker FROM runs r WHERE r.id = w.run_id"
        )
        conn.execute("ANALYZE")


def bare_reads(url: str) -> float:
    """The baseline: read the pass's inputs with plain psycopg and nothing else."""
    with psycopg.connect(url) as conn, Timer() as t:
        conn.execute(
            "SELECT m.*, p.name FROM machines m LEFT JOIN pools p ON p.id = m.pool_id"
        ).fetchall()
        conn.execute("SELECT * FROM gpus").fetchall()
        conn.execute(
            "SELECT w.*, r.* FROM workers w JOIN runs r ON r.id = w.run_id "
            "WHERE w.machine_id IS NOT NULL"
        ).fetchall()
        conn.execute("SELECT * FROM runs WHERE state = 'Pending' AND deleted_at IS NULL").fetchall()
    return t.seconds


# The columns the first pass changed of the runs it placed, of those left waiting and of the
# workers it placed, with their types: what bare_writes writes again.
PLACED_RUN = {
    "state": "text",
    "reason": "text",
    "attempt": "int4",
    "placed_at": "timestamptz",
    "master_port": "int4",
    "state_since": "timestamptz",
}
WAITING_RUN = {"reason": "text", "waits_for": "text", "cause": "text"}
PLACED_WORKER = {
    "state": "text",
    "reason": "text",
    "phase": "text",
    "machine_id": "int8",
    "gpu_ids": "jsonb",
    "attempt": "int4",
    "state_since": "timestamptz",
}
HISTORY = ("state_transitions", "events", "agent_commands")


def bare_writes(url: str, before: dict[str, int], after: dict[str, int]) -> float:
    """What the first pass wrote, written again with plain psycopg in a transaction rolled back:
    the runs' and workers' changed columns by one UPDATE from binary arrays each, its history,
    event and command rows (ids ``before`` < id <= ``after``) by binary COPY. Beside the bare
    reads, the floor of a pass that decides nothing and writes what the first one wrote."""
    with psycopg.connect(url) as conn:
        where = "name NOT LIKE 'one-more%'"
        updates = [
            ("runs", PLACED_RUN, f"state <> 'Pending' AND {where}"),
            ("runs", WAITING_RUN, f"state = 'Pending' AND {where}"),
            ("workers", PLACED_WORKER, f"machine_id IS NOT NULL AND {where}"),
        ]
        arrays = []
        for table, columns, which in updates:
            rows = conn.execute(f"SELECT id, {', '.join(columns)} FROM {table} WHERE {which}")
            values = [list(column) for column in zip(*rows, strict=True)]
            for i, kind in enumerate(columns.values(), start=1):
                if kind == "jsonb":
                    values[i] = [Jsonb(v) for v in values[i]]
            arrays.append(values)
        copies = {table: _copied(conn, table, before[table], after[table]) for table in HISTORY}
        with Timer() as t:
            for (table, columns, _), values in zip(updates, arrays, strict=True):
                sets = ", ".join(f"{c} = v.{c}" for c in columns)
                casts = ", ".join(f"%b::{kind}[]" for kind in ["int8", *columns.values()])
                conn.execute(
                    f"UPDATE {table} SET {sets} FROM unnest({casts}) "
                    f"AS v(id, {', '.join(columns)}) WHERE {table}.id = v.id",
                    values,
                )
            for table, (columns, data) in copies.items():
                statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
                with conn.cursor().copy(statement) as into:
                    into.write(data)
        conn.rollback()
    return t.seconds


def _copied(
    conn: psycopg.Connection[Any], table: str, after_id: int, up_to: int
) -> tuple[list[str], bytes]:
    """The table's rows of ids after ``after_id`` up to ``up_to``, but their ids, as binary COPY
    data, and their columns."""
    columns = [
        c
        for (c,) in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND column_name <> 'id' ORDER BY ordinal_position",
            (table,),
        )
    ]
    query = (
        f"COPY (SELECT {', '.join(columns)} FROM {table} WHERE id > {after_id} "
        f"AND id <= {up_to} ORDER BY id) TO STDOUT (FORMAT BINARY)"
    )
    data = bytearray()
    with conn.cursor().copy(query) as out:
        for chunk in out:
            data += chunk
    return columns, bytes(data)


def last_ids(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(f"SELECT coalesce(max(id), 0) FROM {table}").fetchone()[0]  # type: ignore[index]
            for table in HISTORY
        }


async def passes(url: str) -> tuple[float, float, float, float, int, int]:
    """The first pass over a fresh queue (every run placed or given a reason); the next, which
    plans again (the first changed its own inputs) and writes nothing; one with nothing new
    (the steady state of a cluster whose queue does not move: it reads the digest of its
    inputs and stops); and one after one run more was submitted (a whole plan again)."""
    db = Database.from_url(url)
    before = written(url)
    IDS["before"] = last_ids(url)

    async def one() -> tuple[float, dict[int, scheduling.PassResult]]:
        with Timer() as took:
            async with db.transaction() as session:
                result = await scheduling.schedule_all(session, Clock())
        return took.seconds, result

    try:
        first, result = await one()
        second, _ = await one()
        after = written(url)
        WROTE.update({table: after[table] - before[table] for table in after})
        IDS["after"] = last_ids(url)
        steady, again = await one()
        assert not any(r.planned for r in again.values()), "a pass with nothing new planned"
        submit_one(url)
        one_more, _ = await one()
        placed = sum(len(r.placed) for r in result.values())
        waiting = sum(len(r.reasons) for r in result.values())
        return first, second, steady, one_more, placed, waiting
    finally:
        await db.dispose()


WROTE: dict[str, int] = {}  # the rows the first pass added (what it decided, written)
IDS: dict[str, dict[str, int]] = {}  # the history tables' last ids before it and after it


def written(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
            for table in ("state_transitions", "events", "agent_commands")
        }


def submit_one(url: str) -> None:
    """One more pending run of one 8-GPU worker, as the server writes one."""
    with psycopg.connect(url) as conn:
        ws, cluster, spec = conn.execute(
            "SELECT workspace_id, cluster_id, spec FROM runs ORDER BY id LIMIT 1"
        ).fetchone()  # type: ignore[misc]
        spec = spec | {"name": "one-more", "workers": 1, "gpus": 8}
        run = conn.execute(
            "INSERT INTO runs (workspace_id, cluster_id, name, spec, priority, worker_count, "
            "gpus_per_worker, state, reason, state_since, created_at, attempt, failures_in_row) "
            "VALUES (%s, %s, 'one-more', %s, 50, 1, 8, 'Pending', 'Run created', %s, %s, 0, 0) "
            "RETURNING id",
            (ws, cluster, json.dumps(spec), T0, T0 + timedelta(minutes=30)),
        ).fetchone()[0]  # type: ignore[index]
        conn.execute(
            "INSERT INTO workers (run_id, rank, name, state, reason, state_since, gpu_ids, gpus, "
            "attempt, restarts, ready, phase, created_at) VALUES (%s, 0, 'one-more-0', "
            "'Pending', 'Waiting to be placed with its gang', %s, '[]', 8, 0, 0, false, "
            "'waiting', %s)",
            (run, T0, T0),
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--machines", type=int, default=2_000)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    # as `astraeus worker`, where passes run, does once it has started (issue 40): what it
    # loaded to start leaves the garbage collector's care
    freeze_what_started()
    firsts, seconds, steady, changed, bares, placed, waiting = [], [], [], [], [], 0, 0
    writes: list[float] = []
    for _ in range(args.trials):
        with fresh_database() as url:
            populate(url, args.runs, args.machines)
            bares.append(bare_reads(url))
            first, second, third, fourth, placed, waiting = asyncio.run(passes(url))
            writes.append(bare_writes(url, IDS["before"], IDS["after"]))
            firsts.append(first)
            seconds.append(second)
            steady.append(third)
            changed.append(fourth)
    bare = median(bares)
    result = {
        "runs": args.runs,
        "machines": args.machines,
        "placed": placed,
        "left_waiting_with_a_reason": waiting,
        "pass_seconds": median(firsts),
        "second_pass_seconds": median(seconds),
        "steady_pass_seconds": median(steady),
        "one_more_pass_seconds": median(changed),
        "bare_reads_seconds": bare,
        "ratio": median(firsts) / bare,
        "second_ratio": median(seconds) / bare,
        "steady_ratio": median(steady) / bare,
        "one_more_ratio": median(changed) / bare,
        "first_pass_wrote": dict(WROTE),
        # Not a target: the same writes by plain psycopg; with the reads, a floor of the first.
        "bare_writes_seconds": median(writes),
        "floor_ratio": (bare + median(writes)) / bare,
        "trials": {
            "pass": firsts,
            "second": seconds,
            "steady": steady,
            "one_more": changed,
            "bare": bares,
            "bare_writes": writes,
        },
    }
    save("scheduling_pass", result)
    print(
        f"scheduling pass, {args.runs} pending runs over {args.machines} machines of 8 GPUs: "
        f"first pass {result['pass_seconds']:.2f} s (placed {placed}, {waiting} left waiting "
        f"with a reason; it wrote "
        + ", ".join(f"{n:,} {table}" for table, n in WROTE.items())
        + f" rows and updated {waiting + placed:,} runs), the next "
        f"{result['second_pass_seconds']:.2f} s (plans again: the first changed its inputs), "
        f"then a pass with nothing new {result['steady_pass_seconds']:.3f} s, and one after a "
        f"run more {result['one_more_pass_seconds']:.2f} s; bare reads of its inputs "
        f"{bare:.3f} s; ratios {result['ratio']:.1f}x (target 3x), "
        f"{result['second_ratio']:.1f}x, {result['steady_ratio']:.2f}x (target 1.5x) and "
        f"{result['one_more_ratio']:.1f}x; what the first pass wrote, written again by plain "
        f"psycopg (binary COPY, UPDATE from arrays): {result['bare_writes_seconds']:.3f} s, "
        f"so bare reads and writes {result['floor_ratio']:.1f}x the reads"
    )


if __name__ == "__main__":
    main()
