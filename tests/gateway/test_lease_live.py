"""A live agent under a flood of reads keeps its lease: `astraeus up` and a real `astraeus
agent` on loopback, a lease of 10 s, readers hammering the API for three leases (issue 19)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.live import AgentProcess, Api, Server, free_port

LEASE_S = 10
READS = (
    "{ runs { name state workers { name state reason } } machines { name state } }",
    "{ goodput(by: RUN) { rowCount } }",
)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Server, AgentProcess]]:
    server = Server(
        tmp_path / "data",
        free_port(),
        local_agent=False,
        lease_time=f"{LEASE_S}s",
        scheduler_interval="1s",
    )
    server.start()
    agent = AgentProcess(server, "gpu-a", tmp_path / "gpu-a")
    try:
        yield server, agent
    finally:
        agent.end()
        server.stop()


def _hammer(api: Api, until: float, answered: list[int], failed: list[str]) -> None:
    with httpx.Client(headers=api.headers, timeout=30) as client:
        while time.monotonic() < until:
            for query in READS:
                r = client.post(f"{api.url}/graphql", json={"query": query})
                if r.status_code != 200 or "errors" in r.json():
                    failed.append(f"{r.status_code} {r.text[:200]}")
            r = client.get(f"{api.url}/v1/goodput?by=run")
            if r.status_code != 200:
                failed.append(f"{r.status_code} {r.text[:200]}")
            answered.append(3)


def test_a_live_agent_under_a_flood_of_reads_is_not_lost(
    live: tuple[Server, AgentProcess],
) -> None:
    server, agent = live
    api = Api(server, server.admin_token)
    agent.start()
    deadline = time.monotonic() + 30
    while api.graphql("{ machines { name state } }")["machines"] != [
        {"name": "gpu-a", "state": "ready"}
    ]:
        assert time.monotonic() < deadline, "the agent did not join"
        time.sleep(0.5)

    answered: list[int] = []
    failed: list[str] = []
    until = time.monotonic() + 3 * LEASE_S
    stop_watching = threading.Event()
    seen: list[list[tuple[str, str]]] = []

    def watch() -> None:
        while not stop_watching.is_set():
            data = api.graphql("{ machines { name state } }")["machines"]
            seen.append([(m["name"], m["state"]) for m in data])
            time.sleep(1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(12) as pool:
            for future in [pool.submit(_hammer, api, until, answered, failed) for _ in range(12)]:
                future.result()
    finally:
        stop_watching.set()
        watcher.join()

    assert failed == []
    assert sum(answered) > 100, "the reads hardly ran"
    assert seen and all(machines == [("gpu-a", "ready")] for machines in seen), seen
    assert "Machine lost" not in server.log.read_text()
