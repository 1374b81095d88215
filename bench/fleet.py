"""A fleet of simulated machines in one process, to hold one server against 100, 300 and 1 000
machines on this machine (issue 19): the real agent costs ~100 MB a process, a simulated one a
few hundred kB.

Each machine is what the real agent (agent/connection.py) is to the server: its own gRPC
channel and ``Connect`` stream, its own credential (a ``Join`` per machine with one join token
of many uses), a heartbeat after 10 s without another message, its GPUs in the Hello, and
workers that run: a START is acknowledged and answered READY, a RELEASE RUNNING, and the
worker exits after the seconds its environment asks (``SIM_SECONDS``, default 60) with the
code it asks (``SIM_EXIT``, default 0), or when stopped. While it runs it writes a log line
every ``SIM_LINE_SECONDS`` (1 s), each carrying the time it was written, so a follower can
tell how late a line came; every 5 s (the agent's sample period) a Report: each worker's
Progress and a MetricBatch of the real agent's metrics (CPU, memory, OOM kills, each GPU's
utilisation), apart to a server older than protocol 4. Log tails and follows are answered
from the lines kept. Unlike the real agent it keeps no outbox: after a lost stream it says
hello again with its workers and goes on, without resending what was not acknowledged.

``python -m bench.fleet --machines 100 --seconds 120`` starts ``astraeus serve`` (embedded
broker: its jobs, ticks and passes in the same process; with ``--jobs-apart`` they run in
``astraeus worker`` and ``astraeus scheduler`` over a Redis of their own, as in production) on
a fresh PostgreSQL database, joins
the fleet, fills it with runs, follows some logs and reports what broke first: leases lost, the
tick's delay (the accounting mark behind now), follows' lateness, the server's CPU and RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

from agent.state import period_bodies
from bench.common import OUT, fresh_database, save
from bench.fleet_floor import bare_server
from tests.e2e.services import PrivateRedis

ASTRAEUS = str(Path(sys.executable).parent / "astraeus")
HEARTBEAT_S = 10.0  # agent/config.py AgentConfig.heartbeat_seconds
SAMPLE_S = 5.0  # AgentConfig.sample_seconds
LINE_S = 1.0
KEPT_LINES = 2000
PROTOCOL = 4  # ends reported as causes (issue 22); a Report a period (issue 40)
STAMP = re.compile(r"@(\d+\.\d+)$")
STEP = re.compile(r"^step (\d+) of ")


@dataclass
class Counters:
    """What the fleet saw, all machines together."""

    joined: int = 0
    welcomed: int = 0
    streams_lost: int = 0
    commands: int = 0
    started: int = 0
    running: int = 0
    exited: int = 0
    stopped: int = 0
    lines: int = 0
    follows: int = 0
    sent: int = 0
    errors: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)


@dataclass
class SimWorker:
    worker_id: int
    attempt: int
    gpu_ids: list[int]
    seconds: float
    exit_code: int
    line_seconds: float
    lines: list[str] = field(default_factory=list)
    written: int = 0
    started: bool = False
    ended: bool = False
    task: asyncio.Task[None] | None = None
    follows: dict[str, int] = field(default_factory=dict)  # follow id -> request id


class SimMachine:
    """One simulated machine: a channel, a stream, a credential, heartbeats, GPUs, workers."""

    def __init__(self, fleet: Fleet, name: str, gpus: int) -> None:
        self.fleet, self.name, self.gpus = fleet, name, gpus
        self.credential = ""
        self.ids = 0
        self.workers: dict[int, SimWorker] = {}
        self.queue: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
        self.welcomed = asyncio.Event()
        self.machine_id = 0
        self.sent_at = 0.0  # when a message was last queued (time.monotonic())
        self.takes_reports = False  # the server's Welcome said protocol 4: a Report a period

    @property
    def counters(self) -> Counters:
        return self.fleet.counters

    def send(self, **body: Any) -> None:
        self.ids += 1
        self.queue.put_nowait(agent_pb2.AgentMessage(id=self.ids, **body))
        self.counters.sent += 1
        self.sent_at = time.monotonic()

    def hello(self) -> agent_pb2.AgentMessage:
        return agent_pb2.AgentMessage(
            id=0,
            hello=agent_pb2.Hello(
                machine=self.name,
                pool=self.fleet.pool,
                cpu_cores=64,
                memory_bytes=512 * 2**30,
                gpus=[
                    agent_pb2.Gpu(
                        index=i,
                        uuid=f"SIM-{self.name}-{i}",
                        model="Simulated GPU",
                        memory_bytes=80 * 2**30,
                        healthy=True,
                    )
                    for i in range(self.gpus)
                ],
                agent_version="fleet-sim",
                protocol=PROTOCOL,
                workers=[
                    agent_pb2.KnownWorker(worker_id=w.worker_id, attempt=w.attempt, ended=w.ended)
                    for w in sorted(self.workers.values(), key=lambda w: w.worker_id)
                ],
            ),
        )

    async def live(self, stop: asyncio.Event) -> None:
        """Join once, then hold a stream until told to stop, again after each loss."""
        async with self.fleet.channel() as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            for attempt in range(30):
                try:
                    reply = await stub.Join(
                        agent_pb2.JoinRequest(machine=self.name),
                        metadata=(("authorization", f"Bearer {self.fleet.join_token}"),),
                        timeout=60,
                    )
                    self.credential = str(reply.credential)
                    self.counters.joined += 1
                    break
                except grpc.aio.AioRpcError as e:
                    self.counters.error(f"{self.name} join: {e.code().name} {e.details()}")
                    await asyncio.sleep(min(2**attempt, 10))
            else:
                return
            while not stop.is_set():
                try:
                    await self.session(stub, stop)
                except grpc.aio.AioRpcError as e:
                    self.counters.error(f"{self.name} stream: {e.code().name} {e.details()}")
                if not stop.is_set():
                    self.counters.streams_lost += 1
                    self.welcomed.clear()
                    await asyncio.sleep(1 + random.random())

    async def session(self, stub: agent_pb2_grpc.AgentStub, stop: asyncio.Event) -> None:
        self.queue = asyncio.Queue()
        queue = self.queue

        async def outgoing() -> AsyncIterator[agent_pb2.AgentMessage]:
            yield self.hello()
            while (message := await queue.get()) is not None:
                yield message

        call = stub.Connect(outgoing(), metadata=(("authorization", f"Bearer {self.credential}"),))
        beats = asyncio.create_task(self.every(HEARTBEAT_S, self.heartbeat))
        samples = asyncio.create_task(self.every(SAMPLE_S, self.sample))
        ending = asyncio.create_task(stop.wait())
        try:
            while True:
                reading = asyncio.ensure_future(call.read())
                done, _ = await asyncio.wait({reading, ending}, return_when="FIRST_COMPLETED")
                if reading not in done:
                    reading.cancel()
                    call.cancel()
                    return
                message = reading.result()
                if message is grpc.aio.EOF:
                    return
                self.handle(message)
        finally:
            for task in (beats, samples, ending):
                task.cancel()
            queue.put_nowait(None)

    async def every(self, seconds: float, what: Any) -> None:
        await asyncio.sleep(random.random() * seconds)  # spread the fleet's beats
        while True:
            what()
            await asyncio.sleep(seconds)

    def heartbeat(self) -> None:
        """As the agent beats (agent/connection.py): only after an interval in which nothing
        else went (its timer looks every second; this one every interval, less a second)."""
        if time.monotonic() - self.sent_at >= HEARTBEAT_S - 1:
            self.send(heartbeat=agent_pb2.Heartbeat())

    def sample(self) -> None:
        """What agent/metrics.py's Sampler sends for the running workers every 5 s."""
        at_ms = int(time.time() * 1000)
        samples: list[agent_pb2.Sample] = []
        progress: list[agent_pb2.Progress] = []
        for w in self.workers.values():
            if not w.started or w.ended:
                continue
            progress.append(
                agent_pb2.Progress(
                    worker_id=w.worker_id, attempt=w.attempt, step=w.written, at_ms=at_ms
                )
            )
            for metric, value in (
                ("task_cpu_usage_cores", 1.0 + random.random()),
                ("task_memory_used_bytes", float(4 * 2**30)),
                ("task_oom_kills_total", 0.0),
            ):
                samples.append(
                    agent_pb2.Sample(
                        worker_id=w.worker_id,
                        attempt=w.attempt,
                        metric=metric,
                        at_ms=at_ms,
                        value=value,
                    )
                )
            for gpu in w.gpu_ids:
                samples.append(
                    agent_pb2.Sample(
                        worker_id=w.worker_id,
                        attempt=w.attempt,
                        metric="task_gpu_utilization_ratio",
                        gpu=gpu,
                        at_ms=at_ms,
                        value=0.6 + 0.4 * random.random(),
                    )
                )
        for body in period_bodies(progress, samples, reports=self.takes_reports):
            self.send(**body)  # as the agent sends them (agent/state.py)

    def report(
        self,
        w: SimWorker,
        state: int,
        reason: str = "",
        code: int | None = None,
        cause: int = agent_pb2.END_CAUSE_UNSPECIFIED,
    ) -> None:
        event = agent_pb2.WorkerEvent(
            worker_id=w.worker_id,
            attempt=w.attempt,
            state=state,
            at_ms=int(time.time() * 1000),
            reason=reason,
            cause=cause,  # type: ignore[arg-type]
        )
        if code is not None:
            event.exit_code = code
            if code != 0:
                event.log_tail = "\n".join(w.lines[-20:])
        self.send(worker_event=event)

    def handle(self, message: agent_pb2.ServerMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "welcome":
            self.machine_id = message.welcome.machine_id
            self.takes_reports = message.welcome.protocol >= 4
            if not self.welcomed.is_set():
                self.counters.welcomed += 1
            self.welcomed.set()
        elif kind == "command":
            self.counters.commands += 1
            self.command(message.command)
            self.send(command_ack=agent_pb2.CommandAck(command_ids=[message.command.command_id]))
        elif kind == "log_tail":
            w = self.workers.get(message.log_tail.worker_id)
            lines = w.lines[-(message.log_tail.lines or 100) :] if w else []
            text = "".join(line + "\n" for line in lines)
            self.reply(
                message.id, agent_pb2.LogChunk(worker_id=message.log_tail.worker_id, text=text)
            )
        elif kind == "log_follow_start":
            start = message.log_follow_start
            w = self.workers.get(start.worker_id)
            if start.tail_lines and w is not None and w.lines:
                tail = "".join(line + "\n" for line in w.lines[-start.tail_lines :])
                self.reply(message.id, agent_pb2.LogChunk(worker_id=start.worker_id, text=tail))
            if w is None or w.ended:
                self.reply(message.id, agent_pb2.LogChunk(worker_id=start.worker_id, ended=True))
                return
            self.counters.follows += 1
            w.follows[start.follow_id or str(message.id)] = message.id
        elif kind == "log_follow_stop":
            for w in self.workers.values():
                w.follows.pop(message.log_follow_stop.follow_id, None)

    def reply(self, request_id: int, chunk: agent_pb2.LogChunk) -> None:
        self.send(reply=agent_pb2.Reply(request_id=request_id, log=chunk))

    def command(self, command: agent_pb2.Command) -> None:
        key = command.worker_id
        w: SimWorker | None
        if command.kind == agent_pb2.COMMAND_KIND_START:
            start = command.start
            current = self.workers.get(key)
            if current is not None and current.attempt == start.attempt:
                return  # delivered again after a reconnect
            if current is not None and current.task is not None:
                current.task.cancel()
            env = dict(start.environment)
            w = SimWorker(
                worker_id=key,
                attempt=start.attempt,
                gpu_ids=list(start.gpu_ids),
                seconds=float(env.get("SIM_SECONDS", 60)),
                exit_code=int(env.get("SIM_EXIT", 0)),
                line_seconds=float(env.get("SIM_LINE_SECONDS", LINE_S)),
            )
            self.workers[key] = w
            self.counters.started += 1
            self.report(w, agent_pb2.WORKER_STATE_READY)
        elif command.kind == agent_pb2.COMMAND_KIND_RELEASE:
            w = self.workers.get(key)
            if w is not None and not w.started and not w.ended:
                w.started = True
                self.counters.running += 1
                self.report(w, agent_pb2.WORKER_STATE_RUNNING)
                w.task = asyncio.create_task(self.run(w))
        elif command.kind == agent_pb2.COMMAND_KIND_STOP:
            w = self.workers.get(key)
            if w is None or w.ended:
                return
            if w.task is not None:
                w.task.cancel()
            self.counters.stopped += 1
            if w.started:
                self.end(w, 143, agent_pb2.END_CAUSE_SIGNALLED)
            else:
                self.end(w, None, agent_pb2.END_CAUSE_STOPPED_BEFORE_START)
        elif command.kind == agent_pb2.COMMAND_KIND_DELETE:
            w = self.workers.pop(key, None)
            if w is not None and w.task is not None:
                w.task.cancel()

    async def run(self, w: SimWorker) -> None:
        """The workload: a line every line_seconds, each stamped with when it was written."""
        began = time.monotonic()
        while time.monotonic() - began < w.seconds:
            await asyncio.sleep(w.line_seconds)
            w.written += 1
            line = f"step {w.written} of {w.worker_id} @{time.time():.3f}"
            w.lines.append(line)
            if len(w.lines) > KEPT_LINES:
                del w.lines[: KEPT_LINES // 2]
            self.counters.lines += 1
            for request_id in w.follows.values():
                self.reply(request_id, agent_pb2.LogChunk(worker_id=w.worker_id, text=line + "\n"))
        self.end(w, w.exit_code, agent_pb2.END_CAUSE_EXITED)

    def end(self, w: SimWorker, code: int | None, cause: int) -> None:
        w.ended = True
        self.counters.exited += 1
        self.report(w, agent_pb2.WORKER_STATE_EXITED, code=code, cause=cause)
        for request_id in w.follows.values():
            self.reply(request_id, agent_pb2.LogChunk(worker_id=w.worker_id, ended=True))
        w.follows.clear()


class Fleet:
    """Many simulated machines in this process, each on its own channel and stream."""

    def __init__(
        self,
        target: str,
        join_token: str,
        machines: int,
        gpus: int = 8,
        prefix: str = "sim",
        pool: str = "",
    ) -> None:
        self.target, self.join_token, self.pool = target, join_token, pool
        self.counters = Counters()
        self.machines = [SimMachine(self, f"{prefix}-{i:04d}", gpus) for i in range(machines)]
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    @contextlib.asynccontextmanager
    async def channel(self) -> AsyncIterator[grpc.aio.Channel]:
        channel = grpc.aio.insecure_channel(
            self.target, options=[("grpc.keepalive_time_ms", 30_000)]
        )
        try:
            yield channel
        finally:
            await channel.close()

    async def start(self, per_second: float = 50) -> None:
        """Bring the machines up, ``per_second`` at a time (a fleet does not boot at once)."""
        for m in self.machines:
            self.tasks.append(asyncio.create_task(m.live(self.stop)))
            await asyncio.sleep(1 / per_second)

    def connected(self) -> int:
        return sum(m.welcomed.is_set() for m in self.machines)

    async def all_connected(self, seconds: float) -> int:
        """Wait up to ``seconds`` for every machine's Welcome; how many have one."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(m.welcomed.wait() for m in self.machines)), seconds
            )
        return self.connected()

    async def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 15)


# --- a server to hold the fleet, and what it is measured by ---------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_figures(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system) and RSS bytes of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


def tree_figures(pid: int) -> tuple[float, int]:
    """A process and its children (the embedded worker's processes), CPU s and RSS bytes."""
    cpu, rss = 0.0, 0
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        with contextlib.suppress(OSError, IndexError):
            c, r = process_figures(p)
            cpu, rss = cpu + c, rss + r
    return cpu, rss


def database_figures(url: str) -> dict[str, float]:
    """Leases lost, the tick's delay, workers by state: read straight from the database."""
    with psycopg.connect(url, autocommit=True) as conn:
        lost = conn.execute("SELECT count(*) FROM machines WHERE state <> 'ready'").fetchone()
        lost_workers = conn.execute(
            "SELECT count(DISTINCT worker_id) FROM state_transitions "
            "WHERE reason ILIKE '%lease expired%'"
        ).fetchone()
        mark = conn.execute(
            "SELECT EXTRACT(EPOCH FROM now() - counted_until) FROM accounting_marks"
        ).fetchone()
        running = conn.execute("SELECT count(*) FROM workers WHERE state = 'Running'").fetchone()
    return {
        "machines_not_ready": float(lost[0]) if lost else 0.0,
        "workers_lost_to_leases": float(lost_workers[0]) if lost_workers else 0.0,
        "tick_delay_s": float(mark[0]) if mark and mark[0] is not None else float("nan"),
        "workers_running": float(running[0]) if running else 0.0,
    }


DURATION = re.compile(
    r'^astraeus_job_duration_seconds_(sum|count)\{actor="([^"]+)"\} ([0-9.e+-]+)$', re.M
)


def actor_times(url: str, token: str) -> dict[str, tuple[float, float]]:
    """Each actor's total run time and count so far, from serve's /metrics (the tick, the
    scheduling passes, the lease checks)."""
    text = httpx.get(
        f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
    ).text
    found: dict[str, list[float]] = {}
    for kind, actor, value in DURATION.findall(text):
        found.setdefault(actor, [0.0, 0.0])[0 if kind == "sum" else 1] = float(value)
    return {actor: (total, count) for actor, (total, count) in found.items()}


def mean_times(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Each actor's mean run time, in seconds, between two readings (those that ran)."""
    means = {}
    for actor, (total, count) in after.items():
        total0, count0 = before.get(actor, (0.0, 0.0))
        if count > count0:
            means[actor] = round((total - total0) / (count - count0), 3)
    return means


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


class Server:
    """`astraeus serve` with the embedded broker (its jobs and passes in the process) on a
    database of its own; the admin token from `astraeus bootstrap`."""

    def __init__(
        self, database_url: str, root: Path, jobs_apart: bool = False, **settings: str
    ) -> None:
        self.port, self.agent_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.root = root
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")},
            "ASTRAEUS_DATABASE_URL": database_url,
            "ASTRAEUS_DATA_DIR": str(root / "data"),
            "ASTRAEUS_CONSOLE_DIR": str(root / "no-console"),
            "ASTRAEUS_LOCAL_AGENT": "false",
            "ASTRAEUS_LOG_LEVEL": "warning",
            "ASTRAEUS_PORT": str(self.port),
            "ASTRAEUS_AGENT_PORT": str(self.agent_port),
            **{f"ASTRAEUS_{k.upper()}": v for k, v in settings.items()},
        }
        self.admin = ""
        self.process: subprocess.Popen[bytes] | None = None
        # With jobs apart, production's topology: the jobs (the tick, the passes, the lease
        # checks) in `astraeus worker` and `astraeus scheduler` through a Redis of their own
        self.redis = PrivateRedis(root) if jobs_apart else None
        self.jobs: list[subprocess.Popen[bytes]] = []
        if self.redis is not None:
            self.env.update(ASTRAEUS_BROKER="redis", ASTRAEUS_REDIS_URL=self.redis.url)
        self.profile: Path | None = None  # cProfile's output, when serve runs under it
        self.stop_s = float("nan")  # how long serve took to stop on SIGTERM

    def cli(self, *args: str) -> str:
        return subprocess.run(
            [ASTRAEUS, *args], env=self.env, capture_output=True, text=True, check=True
        ).stdout

    def start(self) -> None:
        if self.redis is not None:
            self.redis.start()
        found = re.search(r"token:\s+(astx_\S+)", self.cli("bootstrap"))
        assert found, "bootstrap printed no token"
        self.admin = found.group(1)
        log = (self.root / "serve.log").open("ab")
        profiler = ["-m", "cProfile", "-o", str(self.profile)] if self.profile else []
        self.process = subprocess.Popen(
            [sys.executable, *profiler, ASTRAEUS, "serve"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.root / "serve.log").read_text()[-2000:]
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    self._start_jobs()
                    return
            time.sleep(0.2)
        raise AssertionError("astraeus serve never answered")

    def _start_jobs(self) -> None:
        if self.redis is None:
            return
        for args in (["worker", "--threads", "2"], ["scheduler"]):
            log = (self.root / f"{args[0]}.log").open("ab")
            self.jobs.append(
                subprocess.Popen(
                    [ASTRAEUS, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
                )
            )

    def jobs_cpu_s(self) -> float:
        """The CPU seconds of the worker and the scheduler so far (0 when embedded)."""
        return sum(tree_figures(p.pid)[0] for p in self.jobs if p.poll() is None)

    def join_token(self, uses: int) -> str:
        return self.cli("agent-token", "create", "--uses", str(uses), "--expires", "2h").strip()

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it (SIGINT when profiled); killed after 60 s
        (stop_s says how long)."""
        if self.process is not None and self.process.poll() is None:
            began = time.monotonic()
            # Under cProfile SIGINT: uvicorn raises a SIGTERM again once it has stopped, which
            # ends the process before the profiler writes what it measured.
            self.process.send_signal(signal.SIGINT if self.profile else signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.stop_s = time.monotonic() - began
        for job in self.jobs:
            if job.poll() is None:
                job.send_signal(signal.SIGTERM)
        for job in self.jobs:
            try:
                job.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
        if self.redis is not None:
            self.redis.stop()


@contextlib.contextmanager
def serving(
    profile: Path | None = None, jobs_apart: bool = False, **settings: str
) -> Iterator[tuple[Server, str]]:
    with fresh_database() as url, tempfile.TemporaryDirectory(prefix="fleet-") as root:
        server = Server(url, Path(root), jobs_apart, **settings)
        server.profile = profile
        try:
            server.start()
            yield server, url
        finally:
            server.stop()
            with contextlib.suppress(OSError):  # what serve said, kept past its folder
                OUT.mkdir(parents=True, exist_ok=True)
                lines = (Path(root) / "serve.log").read_text(errors="replace").splitlines()
                (OUT / "fleet_serve.log").write_text("\n".join(lines[-400:]) + "\n")


async def graphql(
    client: httpx.AsyncClient, url: str, token: str, query: str, **variables: Any
) -> dict[str, Any]:
    answer = (
        await client.post(
            f"{url}/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
        )
    ).json()
    if answer.get("errors"):
        raise RuntimeError(str(answer["errors"])[:500])
    return dict(answer["data"])


async def submit(
    url: str, token: str, specs: list[dict[str, Any]], clients: int = 4
) -> tuple[list[float], list[str]]:
    """Each spec through createRun, from ``clients`` concurrent clients: seconds per submit and
    the errors answered."""
    took: list[float] = []
    errors: list[str] = []
    pending = list(specs)

    async def client() -> None:
        async with httpx.AsyncClient() as http:
            while pending:
                spec = pending.pop()
                began = time.perf_counter()
                try:
                    created = await graphql(
                        http,
                        url,
                        token,
                        "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }",
                        s=spec,
                    )
                    errors.extend(e["message"] for e in created["createRun"]["errors"])
                except (RuntimeError, httpx.HTTPError, ValueError) as e:
                    errors.append(str(e)[:200])
                took.append(time.perf_counter() - began)

    await asyncio.gather(*(client() for _ in range(clients)))
    return took, errors


FOLLOW = "subscription($w: String!) { followLog(worker: $w) { text missed ended } }"


async def follow(
    url: str,
    token: str,
    worker: str,
    lateness: list[float],
    outcome: dict[str, int],
    stop: asyncio.Event,
) -> None:
    """Follow a worker's log over GraphQL (graphql-transport-ws); each line's lateness (its
    receipt minus the time the simulated workload stamped it with) into ``lateness``."""
    from websockets.asyncio.client import connect

    from backend.cli.astra.graphql_ws import (
        PROTOCOL,
        initialise,
        subscribe_message,
        websocket_url,
    )

    last = 0

    try:
        async with connect(websocket_url(url), subprotocols=[PROTOCOL]) as ws:
            await initialise(ws, token)
            await ws.send(subscribe_message(FOLLOW, {"w": worker}))
            while not stop.is_set():
                try:
                    raw = await asyncio.wait_for(ws.recv(), 1)
                except TimeoutError:
                    continue
                now = time.time()
                message = json.loads(raw)
                if message["type"] != "next":
                    outcome["closed:" + message["type"]] = (
                        outcome.get("closed:" + message["type"], 0) + 1
                    )
                    return
                payload = message["payload"]
                if payload.get("errors"):
                    text = str(payload["errors"][0].get("message", ""))[:60]
                    outcome["error:" + text] = outcome.get("error:" + text, 0) + 1
                    return
                chunk = payload["data"]["followLog"]
                outcome["missed"] = outcome.get("missed", 0) + int(chunk["missed"])
                for line in chunk["text"].splitlines():
                    step = STEP.match(line)
                    if step:  # a gap in the steps is lines lost on the way
                        n = int(step.group(1))
                        if last and n > last + 1:
                            outcome["lost"] = outcome.get("lost", 0) + n - last - 1
                        last = max(last, n)
                    stamp = STAMP.search(line)
                    if stamp:
                        lateness.append(now - float(stamp.group(1)))
                if chunk["ended"]:
                    outcome["ended"] = outcome.get("ended", 0) + 1
                    return
    except Exception as e:  # a follow that breaks is a figure, not a crash
        key = f"broken:{type(e).__name__}"
        outcome[key] = outcome.get(key, 0) + 1


async def hold(
    machines: int,
    seconds: float,
    follows: int,
    gpus: int = 8,
    workers_per_run: int = 4,
    profile: Path | None = None,
    jobs_apart: bool = False,
) -> dict[str, Any]:
    """One server against ``machines`` simulated machines for ``seconds`` once they are full;
    ``profile``: serve runs under cProfile, its statistics written there when it stops;
    ``jobs_apart``: the jobs in a worker and a scheduler of their own (production's topology)."""
    began = time.monotonic()
    load_before = round(os.getloadavg()[0], 2)
    with serving(profile, jobs_apart) as (server, database):
        assert server.process is not None
        pid = server.process.pid
        cpu0, rss0 = tree_figures(pid)
        fleet = Fleet(f"127.0.0.1:{server.agent_port}", server.join_token(machines), machines, gpus)
        t0 = time.monotonic()
        await fleet.start()
        await fleet.all_connected(120 + machines / 5)
        joined_s = time.monotonic() - t0
        connected = fleet.connected()
        # fill every GPU: runs of workers_per_run workers of all a machine's GPUs, each
        # running past the end of the hold
        runs = max(1, machines // workers_per_run)
        specs = [
            {
                "name": f"fill-{i:04d}",
                "workers": workers_per_run,
                "gpus": gpus,
                "command": ["simulated"],
                "environment": {"SIM_SECONDS": str(int(seconds + 600))},
            }
            for i in range(runs)
        ]
        submit_took, submit_errors = await submit(server.url, server.admin, specs)
        t1 = time.monotonic()
        fill_deadline = t1 + min(120 + machines / 3, 240)
        figures = database_figures(database)
        while (
            figures["workers_running"] < runs * workers_per_run and time.monotonic() < fill_deadline
        ):
            await asyncio.sleep(2)
            figures = database_figures(database)
        filled_s = time.monotonic() - t1
        lateness: list[float] = []
        outcome: dict[str, int] = {}
        stop = asyncio.Event()
        followers = [
            asyncio.create_task(
                follow(server.url, server.admin, f"fill-{i % runs:04d}-0", lateness, outcome, stop)
            )
            for i in range(follows)
        ]
        timeline: list[dict[str, float]] = []
        actors_a = actor_times(server.url, server.admin)
        cpu_a, _ = tree_figures(pid)
        jobs_a = server.jobs_cpu_s()
        own_a = time.process_time()
        sent_a = fleet.counters.sent
        hold_began = time.monotonic()
        while time.monotonic() - hold_began < seconds:
            await asyncio.sleep(10)
            cpu, rss = tree_figures(pid)
            timeline.append(
                {
                    "t": round(time.monotonic() - hold_began, 1),
                    "rss_mb": round(rss / 2**20, 1),
                    "cpu_s": round(cpu, 1),
                    "connected": fleet.connected(),
                    "load1": round(os.getloadavg()[0], 2),  # the 2 cores are shared: noisy
                    **database_figures(database),
                }
            )
        cpu_b, rss_end = tree_figures(pid)
        jobs_b = server.jobs_cpu_s()
        actors_b = actor_times(server.url, server.admin)
        own_b = time.process_time()
        sent_b = fleet.counters.sent
        held = time.monotonic() - hold_began
        stop.set()
        await asyncio.gather(*followers, return_exceptions=True)
        c = fleet.counters
        result = {
            "machines": machines,
            "gpus_per_machine": gpus,
            "joined": c.joined,
            "connected_after_join": connected,
            "join_s": round(joined_s, 1),
            "runs": runs,
            "submit_p50_s": round(percentile(submit_took, 50), 3),
            "submit_p95_s": round(percentile(submit_took, 95), 3),
            "submit_errors": submit_errors[:5],
            "fill_s": round(filled_s, 1),
            "workers_running_at_fill": figures["workers_running"],
            "hold_s": round(held, 1),
            "streams_lost": c.streams_lost,
            "machines_not_ready_max": max((t["machines_not_ready"] for t in timeline), default=0),
            "workers_lost_to_leases": timeline[-1]["workers_lost_to_leases"] if timeline else 0,
            "tick_delay_max_s": round(max((t["tick_delay_s"] for t in timeline), default=0), 1),
            "follows": follows,
            "follow_lines": len(lateness),
            "follow_p50_s": round(percentile(lateness, 50), 3),
            "follow_p95_s": round(percentile(lateness, 95), 3),
            "follow_outcomes": outcome,
            "server_cpu_pct_of_core": round(100 * (cpu_b - cpu_a) / held, 1),
            # what the server spends, all its work together, per message the machines sent:
            # less bound to how much of the shared cores it was given than its CPU share
            "hold_messages_per_s": round((sent_b - sent_a) / held, 1),
            "server_cpu_ms_per_message": round(1000 * (cpu_b - cpu_a) / max(1, sent_b - sent_a), 2),
            "jobs_apart": jobs_apart,
            "jobs_cpu_pct_of_core": round(100 * (jobs_b - jobs_a) / held, 1),
            "server_rss_mb_start": round(rss0 / 2**20, 1),
            "fleet_cpu_pct_of_core": round(100 * (own_b - own_a) / held, 1),
            "server_rss_mb_end": round(rss_end / 2**20, 1),
            "fleet_messages_sent": c.sent,
            "fleet_errors": c.errors[:5],
            "timeline": timeline,
            "took_s": round(time.monotonic() - began, 1),
            "loadavg_at_end": os.getloadavg(),  # the 2 cores are shared: noisy
            "load1_during_hold": [
                min((t["load1"] for t in timeline), default=0),
                max((t["load1"] for t in timeline), default=0),
            ],
            "load1_before": load_before,
            # each job's mean run time during the hold (the goodput tick, scheduling passes)
            "job_seconds_during_hold": mean_times(actors_a, actors_b),
            "server_cpu_s_before_hold": round(cpu_a - cpu0, 1),
        }
        # serve stops with every machine still connected (as in production): how long it takes
        fleet_closing = asyncio.create_task(fleet.close())
        await asyncio.to_thread(server.stop)
        result["serve_stop_s"] = round(server.stop_s, 1)
        await fleet_closing
        # what serve said of leases (backend/gateway/leases.py, backend/machines/service.py)
        said = (server.root / "serve.log").read_text(errors="replace")
        result["slow_lease_renewals"] = said.count("to renew")
        result["machines_found_lost"] = said.count("lost: its lease expired")
    return result


async def floor(machines: int, seconds: float, gpus: int = 8) -> dict[str, Any]:
    """The same fleet against the bare server (bench/fleet_floor.py): its CPU over a hold of
    the same length once every machine runs its worker, per message the machines sent."""
    port = free_port()
    with bare_server(port) as process:
        fleet = Fleet(f"127.0.0.1:{port}", "bare", machines, gpus)
        await fleet.start()
        await fleet.all_connected(120 + machines / 5)
        for _ in range(120):  # every worker running, as serve's fill waits for
            if fleet.counters.running >= machines:
                break
            await asyncio.sleep(1)
        cpu_a, _ = process_figures(process.pid)
        sent_a, began = fleet.counters.sent, time.monotonic()
        await asyncio.sleep(seconds)
        cpu_b, rss = process_figures(process.pid)
        sent_b, held = fleet.counters.sent, time.monotonic() - began
        await fleet.close()
    return {
        "bare_connected": fleet.connected(),
        "bare_workers_running": fleet.counters.running,
        "bare_cpu_pct_of_core": round(100 * (cpu_b - cpu_a) / held, 1),
        "bare_messages_per_s": round((sent_b - sent_a) / held, 1),
        "bare_cpu_ms_per_message": round(1000 * (cpu_b - cpu_a) / max(1, sent_b - sent_a), 3),
        "bare_rss_mb": round(rss / 2**20, 1),
        "bare_streams_lost": fleet.counters.streams_lost,
    }


def profile_top(path: Path, lines: int = 25) -> str:
    """The functions serve spent most time in (cProfile, by own time, then by cumulative)."""
    import io
    import pstats

    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("tottime").print_stats(lines)
    stats.sort_stats("cumulative").print_stats(lines)
    return out.getvalue()


def summary(r: dict[str, Any]) -> str:
    return (
        f"fleet {r['machines']} machines x {r['gpus_per_machine']} GPUs: joined {r['joined']} "
        f"(all connected in {r['join_s']} s: {r['connected_after_join']}), "
        f"{r['workers_running_at_fill']:.0f} workers running after {r['fill_s']} s; "
        f"held {r['hold_s']} s: streams lost {r['streams_lost']}, machines not ready (max) "
        f"{r['machines_not_ready_max']:.0f}, workers lost to leases "
        f"{r['workers_lost_to_leases']:.0f}, tick delay max {r['tick_delay_max_s']} s, "
        f"follows {r['follows']}: {r['follow_lines']} lines p50 {r['follow_p50_s']} s "
        f"p95 {r['follow_p95_s']} s; serve CPU {r['server_cpu_pct_of_core']}% of a core, "
        f"RSS {r['server_rss_mb_start']} -> {r['server_rss_mb_end']} MB; the simulator "
        f"{r['fleet_cpu_pct_of_core']}% of a core; {r['hold_messages_per_s']} messages/s, serve "
        f"{r['server_cpu_ms_per_message']} ms CPU each; serve stopped in "
        f"{r.get('serve_stop_s')} s; renewals over 2 s {r.get('slow_lease_renewals')}, "
        f"machines found lost "
        f"{r.get('machines_found_lost')}; load average {r.get('load1_before')} before, "
        f"{r.get('load1_during_hold')} during the hold; jobs' mean run time (s) "
        f"{r.get('job_seconds_during_hold')}"
        + (
            f"; the jobs apart (worker and scheduler): {r['jobs_cpu_pct_of_core']}% of a core"
            if r.get("jobs_apart")
            else "; the jobs in serve (embedded broker)"
        )
        + (
            f"; the bare server (reads and acknowledges, no database): "
            f"{r['bare_cpu_pct_of_core']}% of a core at {r['bare_messages_per_s']} messages/s, "
            f"{r['bare_cpu_ms_per_message']} ms CPU each ({r['bare_workers_running']} workers "
            f"running); serve {r['server_cpu_ms_per_message'] / r['bare_cpu_ms_per_message']:.1f}x"
            " the bare server's CPU per message"
            if r.get("bare_cpu_ms_per_message")
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", type=int, nargs="+", default=[100])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--follows", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--profile", action="store_true", help="run serve under cProfile; print its top lines"
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the bare server's run (the baseline)"
    )
    parser.add_argument(
        "--jobs-apart",
        action="store_true",
        help="the jobs (tick, passes, lease checks) in `astraeus worker` and `astraeus "
        "scheduler` over a Redis of their own, as in production, not in serve",
    )
    args = parser.parse_args()
    for n in args.machines:
        profile = Path(tempfile.mkdtemp(prefix="fleet-profile-")) / "serve.prof"
        profiled = profile if args.profile else None
        result = asyncio.run(
            hold(
                n,
                args.seconds,
                args.follows,
                args.gpus,
                profile=profiled,
                jobs_apart=args.jobs_apart,
            )
        )
        if not args.no_floor:  # the baseline, in the same invocation
            result.update(asyncio.run(floor(n, args.seconds, args.gpus)))
        if args.profile and profile.exists():
            top = profile_top(profile)
            kept = save(f"fleet_{n}_profile", {"profile": top.splitlines()})
            print(top, flush=True)
            print(f"  profile: {profile} ({kept})")
        path = save(f"fleet_{n}", result)
        print(summary(result), flush=True)
        print(
            f"  timeline: {[(t['t'], t['rss_mb'], t['tick_delay_s']) for t in result['timeline']]}"
        )
        print(f"  details: {path}", flush=True)


if __name__ == "__main__":
    main()
