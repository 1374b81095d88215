"""A 1 000-line log tail, server -> agent -> server, beside a bare gRPC round trip (issue 4).

Ours: the real ``AgentService`` and the real ``Agent`` on loopback, in one process; the agent
has a worker log on its disk (written through ``WorkerLog``) and each probe is
``AgentService.tail(machine, worker, 1000, 900 KiB, wait_s=5)``: the request goes down the
machine's stream, the agent reads the log's last lines and replies, the server hands them back.

The bare baseline, measured in the same run, alternating with ours: one ``Connect`` stream of
the same generated messages between a bare servicer and a bare client, no disk and no
dispatch. The servicer writes a ``LogTailRequest`` and reads the client's ``Reply``, which
carries a ``LogChunk`` of the very same text built beforehand. Target: ours <= 3 x bare at
the median.

    python -m bench.log_tail [--probes 300] [--rounds 6] [--log-lines 1000 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc
from sqlalchemy import select

from agent.config import AgentConfig
from agent.connection import Agent
from agent.gpus import simulated
from agent.logs import WorkerLog
from backend.clock import SystemClock
from backend.db import Database
from backend.gateway.servicer import AgentService, serve
from backend.logs.service import WorkerRef
from backend.machine_identity import service as identity
from backend.models import Cluster
from backend.organizations import service as organizations
from bench.common import fresh_database, median, save

LINES = 1000
MAX_BYTES = 900 * 1024
WORKER = WorkerRef(41, "llama-sft-0")  # the machine knows it by id (issue 17)
MACHINE = "bench-gpu-01"

Probe = Callable[[], Awaitable[str]]


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def training_line(i: int) -> str:
    """A line as a training loop prints it: about 100 bytes."""
    return (
        f"2026-10-01 01:{i // 3600 % 60:02d}:{i // 60 % 60:02d}.{i % 1000:03d} INFO train "
        f"step={i:07d} loss={2.5 / (1 + i / 5000):.4f} lr=3.00e-04 grad_norm={1 + i % 7 / 10:.3f} "
        f"tok/s={118_000 + i % 997}\n"
    )


def write_log(log_root: Path, lines: int) -> str:
    """The worker's log on the agent's disk, appended in blocks as a worker's output is."""
    log = WorkerLog(log_root, str(WORKER.id))
    log.begin()
    block: list[str] = []
    for i in range(lines):
        block.append(training_line(i))
        if len(block) == 500:
            log.append("".join(block).encode())
            block = []
    if block:
        log.append("".join(block).encode())
    text, _ = log.tail(LINES)
    return text


# -- ours ----------------------------------------------------------------------------------------


async def agent_token(db: Database, clock: SystemClock) -> str:
    """An organisation with the cluster "local", and a machine token for it."""
    async with db.transaction() as session:
        await organizations.bootstrap(session, clock)
        cluster = await session.scalar(select(Cluster).where(Cluster.name == "local"))
        assert cluster is not None
        issued = await identity.issue_join_token(
            session, clock, organization_id=cluster.organization_id, cluster_id=cluster.id
        )
    return issued.secret


@contextlib.asynccontextmanager
async def ours(url: str, data_dir: Path) -> AsyncIterator[Probe]:
    """The real server side and the real agent, joined over loopback; yields one probe."""
    db = Database.from_url(url, pool_size=4)
    clock = SystemClock()
    service = AgentService(db, clock, lease=timedelta(seconds=60))
    address = free_address()
    server = await serve(service, address)
    agent = Agent(
        AgentConfig(
            server=address,
            token=await agent_token(db, clock),
            machine=MACHINE,
            data_dir=data_dir,
            gpus=simulated(8, MACHINE),
            cpu_cores=32,
            memory_bytes=256 * 2**30,
        )
    )
    running = asyncio.create_task(agent.run_forever())
    try:
        deadline = time.monotonic() + 30
        while not service.streams.by_machine:
            assert time.monotonic() < deadline, "the agent did not join"
            await asyncio.sleep(0.05)
        machine_id = next(iter(service.streams.by_machine))

        async def probe() -> str:
            got = await service.tail(machine_id, WORKER, LINES, MAX_BYTES, wait_s=5)
            assert got is not None, "the agent did not answer"
            return got.text

        yield probe
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await server.stop(grace=0)
        await db.dispose()


# -- the bare baseline ---------------------------------------------------------------------------


class BareServicer(agent_pb2_grpc.AgentServicer):
    """``Connect`` and nothing else: each ask is one request written and one reply read."""

    def __init__(self) -> None:
        self.asks: asyncio.Queue[asyncio.Future[agent_pb2.Reply]] = asyncio.Queue()

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.read()  # the client's first message opens the stream
        request = agent_pb2.LogTailRequest(worker_id=WORKER.id, lines=LINES, max_bytes=MAX_BYTES)
        message_id = 0
        while True:
            answer = await self.asks.get()
            message_id += 1
            await context.write(agent_pb2.ServerMessage(id=message_id, log_tail=request))
            reply = await context.read()
            assert reply is not grpc.aio.EOF
            answer.set_result(reply.reply)

    async def ask(self) -> agent_pb2.Reply:
        answer: asyncio.Future[agent_pb2.Reply] = asyncio.get_running_loop().create_future()
        self.asks.put_nowait(answer)
        return await answer


async def _bare_client(address: str, chunk: agent_pb2.LogChunk) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = agent_pb2_grpc.AgentStub(channel).Connect()
        await call.write(agent_pb2.AgentMessage(id=0, heartbeat=agent_pb2.Heartbeat()))
        ids = 0
        while (message := await call.read()) is not grpc.aio.EOF:
            ids += 1
            reply = agent_pb2.Reply(request_id=message.id, log=chunk)
            await call.write(agent_pb2.AgentMessage(id=ids, reply=reply))


@contextlib.asynccontextmanager
async def bare(text: str) -> AsyncIterator[Probe]:
    servicer = BareServicer()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    address = free_address()
    server.add_insecure_port(address)
    await server.start()
    chunk = agent_pb2.LogChunk(worker_id=WORKER.id, text=text)
    client = asyncio.create_task(_bare_client(address, chunk))

    async def probe() -> str:
        return (await servicer.ask()).log.text

    try:
        yield probe
    finally:
        client.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await client
        await server.stop(grace=0)


# -- the run -------------------------------------------------------------------------------------


async def timed(probe: Probe, count: int, expected: str) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        text = await probe()
        times.append(time.perf_counter() - start)
        assert text == expected, "the tail came back different"
    return times


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[18]


async def compare(url: str, log_lines: int, probes: int, rounds: int) -> dict[str, Any]:
    """Both set up side by side; blocks of probes alternate between them (who goes first
    alternates too), so drift of the machine falls on both alike."""
    with tempfile.TemporaryDirectory(prefix="astraeus-bench-") as tmp:
        data_dir = Path(tmp)
        text = write_log(data_dir / "logs", log_lines)
        assert text.count("\n") == LINES
        times: dict[str, list[float]] = {"ours": [], "bare": []}
        async with ours(url, data_dir) as ours_probe, bare(text) as bare_probe:
            sides = {"ours": ours_probe, "bare": bare_probe}
            for probe in sides.values():  # warm-up: connections, caches, the page cache
                await timed(probe, 30, text)
            block = max(probes // rounds, 1)
            for r in range(rounds):
                order = ("ours", "bare") if r % 2 == 0 else ("bare", "ours")
                for side in order:
                    times[side] += await timed(sides[side], block, text)
    ours_ms = [t * 1000 for t in times["ours"]]
    bare_ms = [t * 1000 for t in times["bare"]]
    return {
        "log_lines": log_lines,
        "log_bytes": sum(len(training_line(i)) for i in range(log_lines)),
        "tail_lines": LINES,
        "tail_bytes": len(text.encode()),
        "probes": len(ours_ms),
        "ours_median_ms": median(ours_ms),
        "ours_p95_ms": p95(ours_ms),
        "bare_median_ms": median(bare_ms),
        "bare_p95_ms": p95(bare_ms),
        "ratio": median(ours_ms) / median(bare_ms),
        "p95_ratio": p95(ours_ms) / p95(bare_ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probes", type=int, default=300, help="per side, per log size")
    parser.add_argument("--rounds", type=int, default=6, help="alternating blocks per side")
    parser.add_argument(
        "--log-lines",
        type=int,
        nargs="+",
        default=[1000, 50_000],
        help="sizes of the worker's log (the tail is always its last 1 000 lines)",
    )
    args = parser.parse_args()
    results = []
    for lines in args.log_lines:
        # A database each: the machine's first agent keeps its credential, and a new agent with
        # the join token is refused the same machine (issue 19).
        with fresh_database() as url:
            results.append(asyncio.run(compare(url, lines, args.probes, args.rounds)))
    save("log_tail", {"target_ratio": 3.0, "cases": results})
    print("log tail round trip: AgentService.tail() of the last 1 000 lines vs a bare request")
    print("and reply of the same bytes on one gRPC bidi stream (target: ratio <= 3)")
    print(
        f"{'log':>16} {'tail':>8} {'probes':>6} {'ours p50':>9} {'ours p95':>9} "
        f"{'bare p50':>9} {'bare p95':>9} {'ratio':>6} {'p95 ratio':>9}"
    )
    for r in results:
        log = f"{r['log_lines']:,} lines"
        print(
            f"{log:>16} {r['tail_bytes'] / 1024:>5.0f} KiB {r['probes']:>6} "
            f"{r['ours_median_ms']:>6.2f} ms {r['ours_p95_ms']:>6.2f} ms "
            f"{r['bare_median_ms']:>6.2f} ms {r['bare_p95_ms']:>6.2f} ms "
            f"{r['ratio']:>5.2f}x {r['p95_ratio']:>8.2f}x"
        )


if __name__ == "__main__":
    main()
