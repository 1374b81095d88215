"""Real processes for the e2e tests: a server and agents, the CLI, the seed's blocks."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.live import AgentProcess, Server, free_port, running
from tests.support.http import HTTP


class Cluster:
    def __init__(self, root: Path, lease: str = "8s") -> None:
        self.root = root
        self.server = Server(
            root / "data",
            free_port(),
            local_agent=False,
            lease_time=lease,
            scheduler_interval="1s",
        )
        self.server.start()
        self.token = self.server.admin_token
        self.agents: dict[str, AgentProcess] = {}

    def agent(self, name: str, *extra: str) -> AgentProcess:
        if name not in self.agents:
            self.agents[name] = AgentProcess(self.server, name, self.root / name, extra=extra)
        return self.agents[name]

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        answer = HTTP.post(
            f"{self.server.url}/graphql",
            headers={"Authorization": f"Bearer {self.token}"},
            json={"query": query, "variables": variables},
            timeout=10,
        ).json()
        assert "errors" not in answer, answer
        return dict(answer["data"])

    def submit(self, **spec: Any) -> None:
        created = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }", s=spec
        )
        assert created["createRun"]["errors"] == []

    def get(self, path: str) -> Any:
        return HTTP.get(
            f"{self.server.url}/v1{path}",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
        ).json()

    def workers(self, run: str) -> list[dict[str, Any]]:
        data = self.graphql(
            "query($n: String!) { run(name: $n) { workers { name state reason exitCode "
            "lastFailure machine } } }",
            n=run,
        )
        return list(data["run"]["workers"])

    def wait(self, what: str, check: Callable[[], bool], seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {seconds}s for {what}")
            time.sleep(0.25)

    def status(self, run: str) -> str:
        return str(self.get(f"/jobs/{run}")["status"])

    def close(self) -> None:
        for agent in self.agents.values():
            agent.end()
        self.server.stop()


ASTRA = str(Path(sys.executable).parent / "astra")


def submit(live: tuple[Server, str], spec: dict[str, Any]) -> None:
    server, token = live
    answer = HTTP.post(
        f"{server.url}/graphql",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "query": "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }",
            "variables": {"s": spec},
        },
        timeout=30,  # a server just started, on two cores shared with five lanes
    ).json()
    assert answer["data"]["createRun"]["errors"] == []


def job_when_ended(live: tuple[Server, str], name: str) -> dict[str, Any]:
    server, token = live
    deadline = time.monotonic() + 60
    while True:
        job = HTTP.get(
            f"{server.url}/v1/jobs/{name}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ).json()
        if job["status"] in ("Completed", "Failed", "Stopped") or time.monotonic() > deadline:
            return dict(job)
        time.sleep(0.3)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    with running(tmp_path_factory.mktemp("openapi") / "data", local_agent=False) as live:
        submit(live, {"name": "llama-sft", "gpus": 1, "command": ["true"]})
        yield live


# The seed's block (goodput.txt, after `$ astra astraeus goodput --by run --days 7`).
SEED_BLOCK = """\
GPU-hours
RUN                              HELD     USED GOODPUT    IDLE STALLED   START RESTART FAILURE PREEMPT WAITING
llm                             323.1    300.1     93%     0.0     6.2     2.1     4.1    12.7     0.0     0.0
sweep-7                         146.5    112.4     77%    21.0     0.0     7.7     0.0     0.0     3.3    18.0
TOTAL                           469.6    412.5     88%    21.0     6.2     9.8     4.1    12.7     3.3    18.0

USED = productive (running, GPUs busy); GOODPUT = used / held; WAITING = asked for, not yet held"""  # noqa: E501
