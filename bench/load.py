"""The production topology on loopback under load (issue 19): PostgreSQL (a fresh database on
the server at ASTRAEUS_BENCH_POSTGRES_URL), a Redis of its own, two `astraeus serve`, one
`astraeus worker`, `astraeus scheduler` (started as tests/e2e/test_topology.py starts them),
and N simulated machines of bench/fleet.py (half on each replica's agent port).

Then a submission burst (runs of 1 to 4 workers of 1 to 8 GPUs from several clients, some failing),
readers of /v1/jobs/<run>, /v1/goodput?by=run and GraphQL runs and goodput, followLog and events
subscriptions. It reports the requests' p50/p95/p99 and 5xx, followed lines' lateness and the
lines lost, leases lost, the broker's queue depth, the tick's delay, events out of id order,
conservation per run, and the processes' RSS over time.

Conservation: each run's held GPU-seconds in the ledger (goodput_hours, scope run, held) against
its history: for every worker, the GPUs each transition says it holds (held_gpus) times the time
to its next transition, up to the tick's mark; a worker that has ended (Completed, Failed,
Stopped) holds nothing until a new attempt begins (a Pending or Starting after it), whatever
transitions arrive late after its end. Off by more than 1e-3 GPU-s: a run over- or under-counted.

``make load`` (or ``python -m bench.load --agents 20 --runs 100``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis

from backend import ids
from backend.db import Database
from backend.ids import IdCodec, Kind
from bench.common import fresh_database, save
from bench.fleet import (
    ASTRAEUS,
    Fleet,
    database_figures,
    follow,
    free_port,
    percentile,
    submit,
    tree_figures,
)
from tests.e2e.services import PrivateRedis

ENDED = ("Completed", "Failed", "Stopped")
NEW_ATTEMPT = ("Pending", "Starting", "Preparing", "Queued")


@dataclass
class Topology:
    database: str
    redis_url: str
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    admin: str = ""
    apis: list[str] = field(default_factory=list)
    agent_ports: list[int] = field(default_factory=list)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def cli(self, *args: str) -> str:
        return subprocess.run(
            [ASTRAEUS, *args], env=self.env, capture_output=True, text=True, check=True
        ).stdout

    def start(self, name: str, *args: str, **env: str) -> None:
        log = (self.root / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            [ASTRAEUS, *args], env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT
        )


def healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "the process ended"
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


TRACEMALLOC = """\
import os, threading, time, tracemalloc
from pathlib import Path

_out = Path(os.environ["ASTRAEUS_BENCH_TRACEMALLOC"])
_every = float(os.environ.get("ASTRAEUS_BENCH_TRACEMALLOC_EVERY", "60"))


def _dump() -> None:
    time.sleep(20)  # traced from after the imports (tracing them takes minutes)
    tracemalloc.start(int(os.environ.get("ASTRAEUS_BENCH_TRACEMALLOC_FRAMES", "6")))
    n = 0
    while True:
        time.sleep(_every)
        name = _out / f"{os.getpid()}-{n:03d}.snap"
        tracemalloc.take_snapshot().dump(str(name) + ".part")
        os.replace(str(name) + ".part", name)
        n += 1


threading.Thread(target=_dump, daemon=True, name="bench-tracemalloc").start()
"""


def traced(directory: Path, every_s: float) -> dict[str, str]:
    """The environment that makes a process trace its allocations (tracemalloc) and dump a
    snapshot into ``directory`` every ``every_s`` seconds (a sitecustomize on its PYTHONPATH):
    compare two with ``python -m bench.load --compare A B``."""
    site = directory / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(TRACEMALLOC)
    return {
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "ASTRAEUS_BENCH_TRACEMALLOC": str(directory),
        "ASTRAEUS_BENCH_TRACEMALLOC_EVERY": str(every_s),
    }


def compare(first: str, second: str, top: int = 25) -> str:
    """What grew between two tracemalloc snapshots, by where it was allocated."""
    import tracemalloc

    a = tracemalloc.Snapshot.load(first)
    b = tracemalloc.Snapshot.load(second)
    lines = [f"{sum(s.size for s in b.statistics('filename')) / 2**20:.1f} MB traced"]
    for stat in b.compare_to(a, "traceback")[:top]:
        lines.append(f"{stat.size_diff / 1024:+.0f} KiB ({stat.count_diff:+d} blocks)")
        lines.extend("    " + line for line in stat.traceback.format()[-8:])
    return "\n".join(lines)


@contextlib.contextmanager
def topology(trace: Path | None = None, trace_every_s: float = 60) -> Iterator[Topology]:
    with fresh_database() as url, tempfile.TemporaryDirectory(prefix="load-") as root_name:
        root = Path(root_name)
        broker = PrivateRedis(root)
        t = Topology(url, broker.url, root)
        try:
            broker.start()
            t.env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")},
                "ASTRAEUS_DATABASE_URL": url,
                "ASTRAEUS_BROKER": "redis",
                "ASTRAEUS_REDIS_URL": broker.url,
                "ASTRAEUS_DATA_DIR": str(root / "data"),
                "ASTRAEUS_CONSOLE_DIR": str(root / "no-console"),
                "ASTRAEUS_SCHEDULER_INTERVAL": "1s",
                "ASTRAEUS_LOG_LEVEL": "warning",
            }
            found = re.search(r"token:\s+(astx_\S+)", t.cli("bootstrap"))
            assert found, "bootstrap printed no token"
            t.admin = found.group(1)
            for i in range(2):
                port, agent_port = free_port(), free_port()
                t.apis.append(f"http://127.0.0.1:{port}")
                t.agent_ports.append(agent_port)
                t.start(
                    f"api-{i}",
                    "serve",
                    ASTRAEUS_PORT=str(port),
                    ASTRAEUS_AGENT_PORT=str(agent_port),
                    **(traced(trace / f"api-{i}", trace_every_s) if trace else {}),
                )
                healthy(t.apis[i], t.processes[f"api-{i}"])
            t.start("worker", "worker", "--threads", "2")
            t.start("scheduler", "scheduler")
            yield t
        finally:
            for process in t.processes.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)
            for process in t.processes.values():
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            broker.stop()


def queue_depth(client: redis.Redis) -> dict[str, int]:
    """Messages held by each Dramatiq queue (its .msgs hash: queued and in flight)."""
    depth: dict[str, int] = {}
    for key in client.scan_iter("dramatiq:*.msgs"):
        name = key.decode().removeprefix("dramatiq:").removesuffix(".msgs")
        depth[name] = int(client.hlen(key))
    return depth


def held_truth(rows: list[tuple[int, str, datetime, int]], mark: datetime) -> float:
    """A worker's held GPU-seconds up to ``mark`` from its transitions (worker id, state, at,
    held GPUs), ordered; nothing held from an end until a new attempt."""
    total = 0.0
    ended = False
    held = 0
    since: datetime | None = None
    for _, state, at, held_gpus in rows:
        if at >= mark:
            break
        if since is not None:
            total += held * (at - since).total_seconds()
        if state in ENDED:
            ended, held = True, 0
        elif ended and state not in NEW_ATTEMPT:
            held = 0  # a transition arriving after the worker's end changes nothing
        else:
            ended, held = False, held_gpus
        since = at
    if since is not None:
        total += held * (mark - since).total_seconds()
    return total


async def settled(database: str, timeout_s: float = 180) -> dict[str, Any]:
    """Wait for a tick that counted every transition recorded so far. Agents report a worker's
    end dated when its process ended, and under load it is written minutes later; the next
    tick counts that worker again from then (invariant 3). Until it has, the ledger is ahead
    of the history, not wrong: the check compares them after it."""
    began = time.monotonic()
    first: datetime | None = None
    while True:
        with psycopg.connect(database) as conn:
            row = conn.execute("SELECT counted_until FROM accounting_marks").fetchone()
            mark = row[0] if row else None
            waiting = (
                conn.execute(
                    "SELECT count(*) FROM state_transitions WHERE NOT accounted "
                    "AND transition_at < %s",
                    (mark,),
                ).fetchone()
                if mark is not None
                else None
            )
        pending = int(waiting[0]) if waiting else 0
        first = first or mark
        waited = round(time.monotonic() - began, 1)
        if mark is not None and mark != first and pending == 0:
            return {"settled_after_s": waited}
        if waited > timeout_s:
            return {"settled_after_s": None, "transitions_not_yet_counted": pending}
        await asyncio.sleep(5)


def conservation(database: str) -> dict[str, Any]:
    """Each run's ledger against its history, to 1e-3 GPU-s."""
    with psycopg.connect(database) as conn:
        # One snapshot for the mark, the ledger and the history: under READ COMMITTED each statement
        # sees its own, and a tick committed between them reads as a minute over-counted.
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        mark_row = conn.execute("SELECT counted_until FROM accounting_marks").fetchone()
        if mark_row is None or mark_row[0] is None:
            return {"checked": 0, "note": "no mark yet"}
        mark = mark_row[0]
        names: dict[int, str] = dict(conn.execute("SELECT id, name FROM runs").fetchall())
        ledger: dict[int, float] = dict(
            conn.execute(
                "SELECT scope_id, sum(gpu_seconds) FROM goodput_hours "
                "WHERE scope = 'run' AND held GROUP BY scope_id"
            ).fetchall()
        )
        rows = conn.execute(
            "SELECT run_id, worker_id, state, transition_at, held_gpus FROM state_transitions "
            "WHERE worker_id IS NOT NULL ORDER BY worker_id, transition_at, id"
        ).fetchall()
    by_worker: dict[int, list[tuple[int, str, datetime, int]]] = {}
    run_of: dict[int, int] = {}
    for run_id, worker_id, state, at, held_gpus in rows:
        by_worker.setdefault(worker_id, []).append((worker_id, state, at, held_gpus))
        run_of[worker_id] = run_id
    truth: dict[int, float] = {}
    for worker_id, history in by_worker.items():
        truth[run_of[worker_id]] = truth.get(run_of[worker_id], 0.0) + held_truth(history, mark)
    over, under = [], []
    for run_id in set(truth) | set(ledger):
        diff = float(ledger.get(run_id, 0.0)) - truth.get(run_id, 0.0)
        if diff > 1e-3:
            over.append((names.get(run_id, str(run_id)), round(diff, 3)))
        elif diff < -1e-3:
            under.append((names.get(run_id, str(run_id)), round(diff, 3)))
    return {
        "mark": mark.isoformat(),
        "checked": len(set(truth) | set(ledger)),
        "over": len(over),
        "under": len(under),
        "over_examples": sorted(over, key=lambda x: -x[1])[:5],
        "under_examples": sorted(under, key=lambda x: x[1])[:5],
        "ledger_gpu_s": round(sum(float(v) for v in ledger.values()), 3),
        "history_gpu_s": round(sum(truth.values()), 3),
    }


READS = [
    ("GET /v1/jobs/<run>", "GET", "/v1/jobs/b-{run:03d}", None),
    ("GET /v1/goodput?by=run", "GET", "/v1/goodput?by=run", None),
    ("GraphQL runs", "POST", "/graphql", "{ runs { name state } }"),
    (
        "GraphQL goodput",
        "POST",
        "/graphql",
        "{ goodput(by: RUN) { rowCount total { allocatedGpuHours } } }",
    ),
]


async def reader(
    runs: int,
    apis: list[str],
    token: str,
    took: dict[str, list[float]],
    failures: dict[str, int],
    stop: asyncio.Event,
) -> None:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        while not stop.is_set():
            name, method, path, query = random.choice(READS)
            url = random.choice(apis) + path.format(run=random.randrange(runs))
            began = time.perf_counter()
            try:
                if method == "GET":
                    answer = await http.get(url, timeout=120)
                else:
                    answer = await http.post(url, json={"query": query}, timeout=120)
                status: int | str = answer.status_code
                if status == 200 and method == "POST" and answer.json().get("errors"):
                    status = 299  # a GraphQL error in a 200
            except httpx.HTTPError as e:
                status = type(e).__name__
            took.setdefault(name, []).append(time.perf_counter() - began)
            if status != 200 and not (status == 404 and "/jobs/" in path):  # not submitted yet
                key = f"{name}: {status}"
                failures[key] = failures.get(key, 0) + 1
            await asyncio.sleep(0.5)


EVENTS = "subscription { events { id kind } }"


async def events(
    url: str, token: str, seen: dict[str, int], stop: asyncio.Event, codec: IdCodec
) -> None:
    """An events subscription: how many came, how many not after the one before (by the
    number behind each opaque id, opened with the install's key: backend/ids.py)."""
    from websockets.asyncio.client import connect

    from backend.cli.astra.graphql_ws import (
        PROTOCOL,
        initialise,
        read,
        subscribe_message,
        websocket_url,
    )

    last = 0
    try:
        async with connect(websocket_url(url), subprotocols=[PROTOCOL]) as ws:
            await initialise(ws, token)
            await ws.send(subscribe_message(EVENTS, {}))
            while not stop.is_set():
                try:
                    raw = await asyncio.wait_for(ws.recv(), 1)
                except TimeoutError:
                    continue
                result, ended = read(raw)
                if result is None or ended or result.get("errors"):
                    seen["ended"] = seen.get("ended", 0) + 1
                    return
                event_id = codec.open(Kind.EVENT, result["data"]["events"]["id"]) or 0
                seen["events"] = seen.get("events", 0) + 1
                if event_id <= last:
                    seen["out_of_order"] = seen.get("out_of_order", 0) + 1
                last = max(last, event_id)
    except Exception as e:  # a subscription that breaks is a figure, not a crash
        key = f"broken:{type(e).__name__}"
        seen[key] = seen.get(key, 0) + 1


def burst_specs(
    runs: int, seconds: tuple[int, int], failing: float, seed: int
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    specs = []
    for i in range(runs):
        fails = rng.random() < failing
        specs.append(
            {
                "name": f"b-{i:03d}",
                "workers": rng.randint(1, 4),
                "gpus": rng.choice([1, 2, 4, 8]),
                "command": ["simulated"],
                "environment": {
                    "SIM_SECONDS": str(rng.randint(*seconds)),
                    "SIM_EXIT": "1" if fails else "0",
                },
                **({"restart_policy": "never"} if fails else {}),
            }
        )
    return specs


# Ends seen (issue 40): how long after a workload's exit (its agent's time: an ended worker's
# ``state_since``; a run's ``ended_at``, its last worker's) the worker's ended state, and the
# run's, can be read.
# Polled every END_POLL_S, so each figure is late by at most that much.
END_POLL_S = 0.25


def newly_ended(database: str, table: str, seen: set[int]) -> list[tuple[int, datetime]]:
    ended_at = {"workers": "state_since", "runs": "ended_at"}[table]
    with psycopg.connect(database) as conn:
        return conn.execute(
            f"SELECT id, {ended_at} FROM {table} WHERE {ended_at} IS NOT NULL"
            " AND state = ANY(%s) AND NOT (id = ANY(%s::bigint[]))",
            (list(ENDED), sorted(seen)),
        ).fetchall()


async def ends_seen(database: str, late: dict[str, list[float]], stop: asyncio.Event) -> None:
    """Each worker's and run's end as soon as it can be read, with how late: now - ended_at."""
    seen: dict[str, set[int]] = {"workers": set(), "runs": set()}
    while not stop.is_set():
        for table in ("workers", "runs"):
            rows = await asyncio.to_thread(newly_ended, database, table, seen[table])
            now = datetime.now(UTC)
            for row_id, ended_at in rows:
                seen[table].add(row_id)
                at = ended_at if ended_at.tzinfo else ended_at.replace(tzinfo=UTC)
                late.setdefault(table, []).append(max(0.0, (now - at).total_seconds()))
        await asyncio.sleep(END_POLL_S)


def run_states(database: str) -> dict[str, int]:
    with psycopg.connect(database) as conn:
        return dict(conn.execute("SELECT state, count(*) FROM runs GROUP BY state").fetchall())


def running_workers(database: str, limit: int) -> list[str]:
    with psycopg.connect(database) as conn:
        rows = conn.execute(
            "SELECT name FROM workers WHERE state = 'Running' ORDER BY random() LIMIT %s", (limit,)
        ).fetchall()
    return [r[0] for r in rows]


async def load(
    agents: int,
    runs: int,
    clients: int,
    readers: int,
    follows: int,
    event_subscribers: int,
    seconds: tuple[int, int],
    failing: float,
    limit_s: float,
    seed: int,
    after_s: float = 70,
    trace: Path | None = None,
    trace_every_s: float = 60,
) -> dict[str, Any]:
    began = time.monotonic()
    with topology(trace, trace_every_s) as t:
        broker = redis.Redis.from_url(t.redis_url)
        token = t.cli("agent-token", "create", "--uses", str(agents), "--expires", "2h").strip()
        half = agents // 2
        fleets = [
            Fleet(f"127.0.0.1:{t.agent_ports[0]}", token, half, prefix="a"),
            Fleet(f"127.0.0.1:{t.agent_ports[1]}", token, agents - half, prefix="b"),
        ]
        for fleet in fleets:
            await fleet.start()
        connected = sum([await f.all_connected(60 + agents / 5) for f in fleets])
        stop = asyncio.Event()
        took: dict[str, list[float]] = {}
        failures: dict[str, int] = {}
        seen: list[dict[str, int]] = [{} for _ in range(event_subscribers)]
        database = Database.from_url(t.database)
        try:
            codec = await ids.codec(database)
        finally:
            await database.dispose()
        background = [
            asyncio.create_task(reader(runs, t.apis, t.admin, took, failures, stop))
            for _ in range(readers)
        ] + [
            asyncio.create_task(events(t.apis[i % 2], t.admin, seen[i], stop, codec))
            for i in range(event_subscribers)
        ]
        timeline: list[dict[str, Any]] = []
        pids = {name: p.pid for name, p in t.processes.items()}

        async def sample() -> None:
            while not stop.is_set():
                figures = database_figures(t.database)
                timeline.append(
                    {
                        "t": round(time.monotonic() - began, 1),
                        "rss_mb": {n: round(tree_figures(p)[1] / 2**20) for n, p in pids.items()},
                        "queue": queue_depth(broker),
                        "tick_delay_s": round(figures["tick_delay_s"], 1),
                        "machines_not_ready": figures["machines_not_ready"],
                        "workers_lost_to_leases": figures["workers_lost_to_leases"],
                        "workers_running": figures["workers_running"],
                        "runs": run_states(t.database),
                    }
                )
                await asyncio.sleep(5)

        sampler = asyncio.create_task(sample())
        ends_late: dict[str, list[float]] = {}
        ends_task = asyncio.create_task(ends_seen(t.database, ends_late, stop))
        background.append(ends_task)
        burst_began = time.monotonic()
        submit_took, submit_errors = await submit(
            t.apis[0], t.admin, burst_specs(runs, seconds, failing, seed), clients
        )
        burst_s = time.monotonic() - burst_began
        # follow workers as they come to run: ``follows`` open at a time, one that ends (its
        # worker ended) replaced by a follow of another running worker
        lateness: list[float] = []
        outcome: dict[str, int] = {}
        followed: set[str] = set()
        followers: list[asyncio.Task[None]] = []
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            open_follows = sum(1 for f in followers if not f.done())
            if open_follows < follows:
                wanted = follows - open_follows
                for name in running_workers(t.database, follows * 2):
                    if name not in followed and wanted > 0:
                        wanted -= 1
                        followed.add(name)
                        followers.append(
                            asyncio.create_task(
                                follow(
                                    t.apis[len(followed) % 2],
                                    t.admin,
                                    name,
                                    lateness,
                                    outcome,
                                    stop,
                                )
                            )
                        )
            states = run_states(t.database)
            if sum(states.get(s, 0) for s in ENDED) >= runs:
                break
            await asyncio.sleep(3)
        finished_s = time.monotonic() - burst_began
        # the queue after the burst, and a tick past the last end
        await asyncio.sleep(after_s)
        stop.set()
        await asyncio.gather(sampler, *background, *followers, return_exceptions=True)
        if (broken := ends_task.exception()) is not None:
            raise broken  # a measurement that failed is no figure
        for fleet in fleets:
            await fleet.close()
        settle = await settled(t.database)
        ledger = {**conservation(t.database), **settle}
        counters = [f.counters for f in fleets]
        reads = {
            name: {
                "n": len(xs),
                "p50_s": round(percentile(xs, 50), 3),
                "p95_s": round(percentile(xs, 95), 3),
                "p99_s": round(percentile(xs, 99), 3),
            }
            for name, xs in sorted(took.items())
        }
        drained_at = next(
            (
                s["t"]
                for s in timeline
                if s["t"] > burst_began - began + burst_s
                and sum(v for k, v in s["queue"].items() if not k.endswith(".XQ")) == 0
            ),
            None,
        )
        return {
            "agents": agents,
            "connected": connected,
            "runs": runs,
            "clients": clients,
            "readers": readers,
            "follows": len(followed),
            "event_subscribers": event_subscribers,
            "burst_s": round(burst_s, 1),
            "submit_p50_s": round(percentile(submit_took, 50), 3),
            "submit_p95_s": round(percentile(submit_took, 95), 3),
            "submit_p99_s": round(percentile(submit_took, 99), 3),
            "submit_errors": submit_errors[:5],
            "all_ended_s": round(finished_s, 1),
            "run_states": run_states(t.database),
            "reads": reads,
            "read_failures": failures,
            "follow_lines": len(lateness),
            "follow_p50_s": round(percentile(lateness, 50), 3),
            "follow_p95_s": round(percentile(lateness, 95), 3),
            "follow_p99_s": round(percentile(lateness, 99), 3),
            "follow_late_over_5s": sum(x > 5 for x in lateness),
            "follow_outcomes": outcome,
            "ends_seen": {
                table: {
                    "n": len(xs),
                    "p50_s": round(percentile(xs, 50), 3),
                    "p95_s": round(percentile(xs, 95), 3),
                    "p99_s": round(percentile(xs, 99), 3),
                    "max_s": round(max(xs), 3),
                }
                for table, xs in sorted(ends_late.items())
            },
            "events": {
                "received": sum(s.get("events", 0) for s in seen),
                "out_of_order": sum(s.get("out_of_order", 0) for s in seen),
                "subscribers_out_of_order": sum(1 for s in seen if s.get("out_of_order")),
                "ended_or_broken": {
                    k: sum(s.get(k, 0) for s in seen)
                    for k in {k for s in seen for k in s}
                    if k not in ("events", "out_of_order")
                },
            },
            "streams_lost": sum(c.streams_lost for c in counters),
            "machines_not_ready_max": max((s["machines_not_ready"] for s in timeline), default=0),
            "workers_lost_to_leases": timeline[-1]["workers_lost_to_leases"] if timeline else 0,
            "tick_delay_max_s": max((s["tick_delay_s"] for s in timeline), default=0),
            "queue_max": max(
                (sum(v for k, v in s["queue"].items() if not k.endswith(".XQ")) for s in timeline),
                default=0,
            ),
            "queue_end": timeline[-1]["queue"] if timeline else {},
            "queue_drained_at_s": drained_at,
            "conservation": ledger,
            "rss_mb_first": timeline[0]["rss_mb"] if timeline else {},
            "rss_mb_middle": timeline[len(timeline) // 2]["rss_mb"] if timeline else {},
            "rss_mb_last": timeline[-1]["rss_mb"] if timeline else {},
            "rss_at_s": [timeline[i]["t"] for i in (0, len(timeline) // 2, -1)] if timeline else [],
            "fleet_errors": [e for c in counters for e in c.errors][:5],
            "timeline": timeline,
            "took_s": round(time.monotonic() - began, 1),
            "loadavg_at_end": os.getloadavg(),  # the 2 cores are shared: noisy
        }


def summary(r: dict[str, Any]) -> str:
    c = r["conservation"]
    reads = ", ".join(
        f"{name} p50 {v['p50_s']} p95 {v['p95_s']} p99 {v['p99_s']} s (n {v['n']})"
        for name, v in r["reads"].items()
    )
    return "\n".join(
        [
            f"load: {r['agents']} simulated agents of 8 GPUs on 2 serve + worker + scheduler; "
            f"{r['runs']} runs from {r['clients']} clients in {r['burst_s']} s (submit p50 "
            f"{r['submit_p50_s']} p95 {r['submit_p95_s']} p99 {r['submit_p99_s']} s), all ended "
            f"after {r['all_ended_s']} s: {r['run_states']}",
            f"  reads ({r['readers']} readers): {reads}; failures {r['read_failures'] or 'none'}",
            f"  follows {r['follows']}: {r['follow_lines']} lines, late p50 {r['follow_p50_s']} "
            f"p95 {r['follow_p95_s']} p99 {r['follow_p99_s']} s, over 5 s "
            f"{r['follow_late_over_5s']}, {r['follow_outcomes']}",
            "  ends seen after the workload's exit (polled every "
            f"{END_POLL_S} s; target p99 < 5 s): "
            + "; ".join(
                f"{table} p50 {v['p50_s']} p95 {v['p95_s']} p99 {v['p99_s']} max {v['max_s']} s "
                f"(n {v['n']})"
                for table, v in r["ends_seen"].items()
            ),
            f"  events ({r['event_subscribers']} subscribers): {r['events']}",
            f"  leases: streams lost {r['streams_lost']}, machines not ready (max) "
            f"{r['machines_not_ready_max']:.0f}, workers lost to leases "
            f"{r['workers_lost_to_leases']:.0f}",
            f"  queue: max {r['queue_max']} messages, drained at "
            f"{r['queue_drained_at_s']} s, at the end {r['queue_end']}; tick delay max "
            f"{r['tick_delay_max_s']} s",
            f"  conservation: {c.get('checked')} runs, over-counted {c.get('over')} "
            f"{c.get('over_examples')}, under-counted {c.get('under')} "
            f"{c.get('under_examples')}; ledger {c.get('ledger_gpu_s')} GPU-s, history "
            f"{c.get('history_gpu_s')} GPU-s (checked once a tick had counted every "
            f"transition: after {c.get('settled_after_s')} s)",
            f"  RSS MB at {r['rss_at_s']} s: start {r['rss_mb_first']}, middle "
            f"{r['rss_mb_middle']}, end {r['rss_mb_last']}",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--readers", type=int, default=10)
    parser.add_argument("--follows", type=int, default=20)
    parser.add_argument("--event-subscribers", type=int, default=10)
    parser.add_argument("--run-seconds", type=int, nargs=2, default=[10, 40])
    parser.add_argument("--failing", type=float, default=0.1)
    parser.add_argument("--limit", type=float, default=600, help="seconds to wait for the runs")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument(
        "--after", type=float, default=70, help="seconds to keep measuring after the runs end"
    )
    parser.add_argument(
        "--tracemalloc",
        type=Path,
        help="a folder: each serve traces its allocations and dumps a snapshot there",
    )
    parser.add_argument("--tracemalloc-every", type=float, default=60, help="seconds")
    parser.add_argument(
        "--compare", nargs=2, metavar="SNAPSHOT", help="only print what grew from one to the other"
    )
    args = parser.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return
    result = asyncio.run(
        load(
            args.agents,
            args.runs,
            args.clients,
            args.readers,
            args.follows,
            args.event_subscribers,
            (args.run_seconds[0], args.run_seconds[1]),
            args.failing,
            args.limit,
            args.seed,
            args.after,
            args.tracemalloc,
            args.tracemalloc_every,
        )
    )
    path = save(f"load_{args.agents}", result)
    print(summary(result), flush=True)
    print(f"  details: {path}", flush=True)


if __name__ == "__main__":
    main()
