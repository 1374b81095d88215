"""A followed log's latency, from the worker's write to the GraphQL client (issue 6), beside a
bare pipeline of the same shape measured in the same run. Figures are reported, never
asserted; the targets (issue 24: pushed when written, not polled) are printed beside them.

Ours: `astraeus up` (embedded: SQLite, the local agent) runs a worker that writes a line every
50 ms, each with the time it was written; a client follows it with the ``followLog``
subscription over a real WebSocket (graphql-transport-ws). The line goes: the worker's file,
the agent's follower (woken by the agent's inotify watcher of followed logs, watchfiles,
agent/log_watch.py), the agent's gRPC stream, the API server, the WebSocket. Latency: arrival
at the client less the time in the line.

The bare baseline: the same writer process writing to a file; a bare watchfiles watcher of
the file's folder (the agent's step and debounce) reading what is new on each change and
sending it over a bare WebSocket server (``websockets``) to a client in the same process. What
ours adds is the agent's follow, the gRPC hop, the server and GraphQL.

    python -m bench.log_follow [--lines 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from watchfiles import awatch
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from agent.log_watch import WATCH_DEBOUNCE_MS, WATCH_STEP_MS
from backend.cli.astra.graphql_ws import subscribe
from bench.common import save
from tests.e2e.live import Server, free_port

INTERVAL_S = 0.05
TARGET_MEDIAN_MS = 15  # issue 24
TARGET_P95_MS = 50
WRITER = (
    "import sys, time\n"
    "out = open(sys.argv[2], 'w') if len(sys.argv) > 2 else sys.stdout\n"
    "time.sleep(1.5)\n"
    "for i in range(int(sys.argv[1])):\n"
    "    out.write(f'line {i} at {time.time():.6f}\\n'); out.flush()\n"
    "    time.sleep(0.05)\n"
)
FOLLOW = """subscription($w: String!) { followLog(worker: $w) { text ended } }"""


def latencies(text: str, arrived: float) -> list[float]:
    return [arrived - float(line.rsplit(" at ", 1)[1]) for line in text.splitlines() if line]


async def ours(server: Server, token: str, name: str, lines: int) -> list[float]:
    spec = {
        "name": name,
        "gpus": 1,
        "restart_policy": "never",
        "command": ["python3", "-c", WRITER, str(lines)],
    }
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        created = await client.post(
            "/graphql",
            json={
                "query": "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }",
                "variables": {"s": spec},
            },
        )
        assert created.json()["data"]["createRun"]["errors"] == [], created.text
        deadline = time.monotonic() + 60
        while (await client.get(f"/v1/tasks/{name}-0")).json().get("status") != "Running":
            assert time.monotonic() < deadline, f"{name} never ran"
            await asyncio.sleep(0.05)
    out: list[float] = []
    async for result in subscribe(server.url, token, FOLLOW, w=f"{name}-0"):
        assert "errors" not in result, result
        out += latencies(result["data"]["followLog"]["text"], time.time())
    return out


async def bare(lines: int, folder: Path) -> list[float]:
    watched = folder / "bare"
    watched.mkdir(exist_ok=True)
    path = watched / "current.log"
    path.write_text("")
    port = free_port()

    async def pusher(ws: ServerConnection) -> None:
        changes = awatch(
            watched,
            watch_filter=None,
            step=WATCH_STEP_MS,
            debounce=WATCH_DEBOUNCE_MS,
            recursive=False,
            rust_timeout=200,  # an empty batch now and then: to see the writer's end
            yield_on_timeout=True,
        )
        with path.open() as log:
            text = log.read()  # written before the watcher began
            async for _ in changes:
                text += log.read()
                if text:
                    await ws.send(text)
                if writer.returncode is not None and not text:
                    return
                text = ""

    out: list[float] = []
    async with serve(pusher, "127.0.0.1", port):
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, str(lines), str(path)
        )
        async with connect(f"ws://127.0.0.1:{port}") as ws:
            async for text in ws:
                out += latencies(str(text), time.time())
        await writer.wait()
    return out


def summary(xs: list[float]) -> dict[str, float]:
    ordered = sorted(xs)
    return {
        "lines": len(xs),
        "median_ms": statistics.median(xs) * 1000,
        "p95_ms": ordered[int(len(ordered) * 0.95) - 1] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


async def run(lines: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = Server(folder / "data", free_port())
        server.start()
        token = server.admin_token  # kept in its file, never printed
        ours_all: list[float] = []
        bare_all: list[float] = []
        try:
            for i in range(rounds):
                ours_all += await ours(server, token, f"follow-{i}", lines)
                bare_all += await bare(lines, folder)
        finally:
            server.stop()
    mine, theirs = summary(ours_all), summary(bare_all)
    return {
        "ours": mine,
        "bare": theirs,
        "ratio_median": mine["median_ms"] / theirs["median_ms"],
        "ratio_p95": mine["p95_ms"] / theirs["p95_ms"],
        "target_median_ms": TARGET_MEDIAN_MS,
        "target_p95_ms": TARGET_P95_MS,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    result = asyncio.run(run(args.lines, args.rounds))
    save("log_follow", result)
    o, b = result["ours"], result["bare"]
    print(
        f"followed log, a line every {INTERVAL_S * 1000:.0f} ms, write to GraphQL client "
        f"({o['lines']} lines): median {o['median_ms']:.0f} ms, p95 {o['p95_ms']:.0f} ms, "
        f"max {o['max_ms']:.0f} ms (targets: median <= {TARGET_MEDIAN_MS} ms, p95 <= "
        f"{TARGET_P95_MS} ms); bare watchfiles watcher ({WATCH_STEP_MS} ms steps) + WebSocket: "
        f"median {b['median_ms']:.0f} ms, p95 {b['p95_ms']:.0f} ms; ratio "
        f"{result['ratio_median']:.2f} (median), {result['ratio_p95']:.2f} (p95)"
    )


if __name__ == "__main__":
    main()
