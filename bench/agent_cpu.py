"""The agent's own CPU while it samples 8 running workers every 5 s (issue 4: under 1% of a core).

A real ``astraeus agent`` process (simulated GPUs, ``--sample 5 --heartbeat 10``) joins the
real server side (``AgentService``, in this process, on loopback, over a fresh PostgreSQL
database). One run of 8 one-GPU workers is submitted and placed through the services; each
worker is a real ``sleep`` process kept by its shim. Once all 8 run, and after a warm-up, the
agent's CPU time (utime + stime of all its threads, from /proc; not its children: shims and
workers are sessions of their own) is read over the window and given as % of one core.

The baseline, in the same window: an idle Python process that only sleeps. The sampling
rounds are counted from what reached the server (distinct sample times stored in the window),
giving the agent's CPU per round. Beside them, the agent's CPU in a window before the run is
submitted (joined, heartbeating, nothing to sample): what the workers add is the difference.

    python -m bench.agent_cpu [--seconds 60] [--idle-seconds 30] [--warmup 10] [--workers 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import func, select

from agent.executor import end_left_workers
from backend.access import service as access
from backend.clock import SystemClock
from backend.db import Database
from backend.gateway.servicer import AgentService, serve
from backend.machine_identity import service as identity
from backend.models import Cluster, MetricSample, Run, Worker
from backend.organizations import service as organizations
from backend.runs import service as runs
from backend.scheduling import service as scheduling
from bench.common import fresh_database, save

ASTRAEUS = str(Path(sys.executable).parent / "astraeus")
MACHINE = "bench-gpu-01"
RUN = "sampled"
TICKS = os.sysconf("SC_CLK_TCK")


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, all its threads together (children are not counted)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def read(path: Path) -> str:
    return path.read_text(errors="replace")


def new_file(path: Path) -> BinaryIO:
    return path.open("wb")


def agent_command(root: Path, address: str, machine_token: str) -> list[str]:
    """``astraeus agent`` as an operator starts it, with its token in a file."""
    token = root / "agent.token"
    token.write_text(machine_token)
    return [
        *(ASTRAEUS, "agent", "--server", address, "--token-file", str(token)),
        *("--name", MACHINE, "--data-dir", str(root / "agent"), "--simulate-gpus", "8"),
        *("--sample", "5", "--heartbeat", "10"),
    ]


async def tokens(db: Database, clock: SystemClock) -> tuple[str, str]:
    """The first organisation (its admin's token) and a machine token for its cluster."""
    async with db.transaction() as session:
        boot = await organizations.bootstrap(session, clock)
        assert boot is not None
        cluster = await session.scalar(select(Cluster).where(Cluster.name == "local"))
        assert cluster is not None
        issued = await identity.issue_join_token(
            session, clock, organization_id=cluster.organization_id, cluster_id=cluster.id
        )
    return boot.token, issued.secret


async def submit_and_place(db: Database, clock: SystemClock, token: str, workers: int) -> None:
    spec = {
        "name": RUN,
        "workers": workers,
        "gpus": 1,
        "cpu": 0.1,
        "memory_bytes": 64 * 2**20,
        "command": ["sleep", "100000"],
        "restart_policy": "never",
    }
    async with db.transaction() as session:
        principal = await access.authenticate(session, token)
        await runs.create_run(session, clock, principal, spec)
    async with db.transaction() as session:
        await scheduling.schedule_all(session, clock)


async def running_workers(db: Database) -> int:
    async with db.read() as session:
        count = await session.scalar(
            select(func.count())
            .select_from(Worker)
            .join(Run, Run.id == Worker.run_id)
            .where(Run.name == RUN, Worker.state == "Running")
        )
    return int(count or 0)


async def rounds_stored(db: Database, start_ms: int, end_ms: int) -> tuple[int, int]:
    """Sampling rounds (distinct sample times) and samples that reached the server."""
    async with db.read() as session:
        row = (
            await session.execute(
                select(func.count(func.distinct(MetricSample.ts)), func.count()).where(
                    MetricSample.ts.between(start_ms, end_ms)
                )
            )
        ).one()
    return int(row[0]), int(row[1])


async def wait_until(what: str, check: Any, seconds: float, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"agent_cpu: waited {seconds:.0f} s for {what}\n{read(log)}")
        await asyncio.sleep(0.2)


async def stop(process: asyncio.subprocess.Process, sig: int = signal.SIGINT) -> None:
    if process.returncode is None:
        process.send_signal(sig)
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


async def window(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU seconds each process used over the next ``seconds``, and the wall time it took."""
    before, start = {k: cpu_seconds(p) for k, p in pids.items()}, time.time()
    await asyncio.sleep(seconds)
    after, end = {k: cpu_seconds(p) for k, p in pids.items()}, time.time()
    return {"start": start, "wall": end - start, **{k: after[k] - before[k] for k in pids}}


async def measure(
    url: str, seconds: float, idle_seconds: float, warmup: float, workers: int
) -> dict[str, Any]:
    db = Database.from_url(url, pool_size=4)
    clock = SystemClock()
    service = AgentService(db, clock, lease=timedelta(seconds=60))
    address = free_address()
    server = await serve(service, address)
    admin, machine_token = await tokens(db, clock)
    with tempfile.TemporaryDirectory(prefix="astraeus-bench-") as tmp:
        root = Path(tmp)
        command = agent_command(root, address, machine_token)
        log = root / "agent.log"
        with new_file(log) as out:
            agent = await asyncio.create_subprocess_exec(*command, stdout=out, stderr=out)
        sleeper = await asyncio.create_subprocess_exec(
            sys.executable, "-c", f"import time; time.sleep({idle_seconds + seconds + 300})"
        )
        pids = {"agent": agent.pid, "sleeper": sleeper.pid}
        try:

            async def joined() -> bool:
                return bool(service.streams.by_machine)

            async def all_running() -> bool:
                return await running_workers(db) == workers

            await wait_until("the agent to join", joined, 60, log)
            await asyncio.sleep(warmup)
            idle = await window(pids, idle_seconds) if idle_seconds else None
            await submit_and_place(db, clock, admin, workers)
            await wait_until(f"{workers} running workers", all_running, 60, log)
            await asyncio.sleep(warmup)
            busy = await window(pids, seconds)
            rss = rss_bytes(agent.pid)
            assert agent.returncode is None, read(log)
            assert await running_workers(db) == workers, "a worker stopped during the window"
            await asyncio.sleep(1)  # the window's last samples reach the server
            start_ms = int(busy["start"] * 1000)
            end_ms = start_ms + int(busy["wall"] * 1000)
            rounds, samples = await rounds_stored(db, start_ms, end_ms)
        finally:
            await stop(agent)
            end_left_workers(root / "agent")
            await stop(sleeper, signal.SIGKILL)
            await server.stop(grace=0)
            await db.dispose()
    return {
        "workers": workers,
        "sample_seconds": 5,
        "heartbeat_seconds": 10,
        "window_seconds": busy["wall"],
        "agent_cpu_seconds": busy["agent"],
        "agent_percent_of_a_core": 100 * busy["agent"] / busy["wall"],
        "sampling_rounds": rounds,
        "samples_stored": samples,
        "agent_cpu_ms_per_round": 1000 * busy["agent"] / rounds if rounds else None,
        "agent_rss_bytes": rss,
        "idle_python_percent_of_a_core": 100 * busy["sleeper"] / busy["wall"],
        "agent_without_workers": None
        if idle is None
        else {
            "window_seconds": idle["wall"],
            "agent_cpu_seconds": idle["agent"],
            "agent_percent_of_a_core": 100 * idle["agent"] / idle["wall"],
            "idle_python_percent_of_a_core": 100 * idle["sleeper"] / idle["wall"],
        },
        "clock_tick_seconds": 1 / TICKS,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60, help="the window with the workers")
    parser.add_argument(
        "--idle-seconds", type=float, default=30, help="a window before any worker (0: none)"
    )
    parser.add_argument("--warmup", type=float, default=10, help="before each window")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    with fresh_database() as url:
        r = asyncio.run(measure(url, args.seconds, args.idle_seconds, args.warmup, args.workers))
    r["target_percent_of_a_core"] = 1.0
    save("agent_cpu", r)
    per_round = r["agent_cpu_ms_per_round"]
    print(
        f"agent CPU, {r['workers']} running workers sampled every 5 s, heartbeat 10 s, over "
        f"{r['window_seconds']:.0f} s (target < 1% of a core)"
    )
    print(f"{'':>32} {'% of a core':>11} {'CPU s':>6} {'rounds':>6} {'ms/round':>8} {'RSS':>8}")
    label = f"astraeus agent, {r['workers']} workers"
    print(
        f"{label:>32} "
        f"{r['agent_percent_of_a_core']:>10.3f}% {r['agent_cpu_seconds']:>6.2f} "
        f"{r['sampling_rounds']:>6} {per_round if per_round is not None else float('nan'):>8.1f} "
        f"{r['agent_rss_bytes'] / 2**20:>4.0f} MiB"
    )
    idle = r["agent_without_workers"]
    if idle is not None:
        print(
            f"{'astraeus agent, no workers':>32} {idle['agent_percent_of_a_core']:>10.3f}% "
            f"{idle['agent_cpu_seconds']:>6.2f}   (a {idle['window_seconds']:.0f} s window "
            "before the run)"
        )
    print(f"{'idle python (baseline)':>32} {r['idle_python_percent_of_a_core']:>10.3f}%")


if __name__ == "__main__":
    main()
