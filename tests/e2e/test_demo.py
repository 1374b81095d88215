"""`astraeus up --demo` (issue 9): the example workloads are submitted once the server answers
and run on the local agent: the gang trains, the failing one fails with its program's exit
code, and each says so in the seed's words."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from backend.cli.demo import specs
from tests.e2e.live import running
from tests.support.http import HTTP

QUERY = """{ runs(all: true) { name state reason failedWorker { advice { kind lookAt } } } }"""


def runs(url: str, token: str) -> dict[str, dict[str, Any]]:
    answer = HTTP.post(
        f"{url}/graphql", json={"query": QUERY}, headers={"Authorization": f"Bearer {token}"}
    ).json()
    return {r["name"]: r for r in answer["data"]["runs"]}


def test_the_demo_submits_the_examples_and_they_run(tmp_path: Path) -> None:
    with running(tmp_path / "data", up_args=("--demo",)) as (server, token):
        names = {s["name"] for s in specs()}
        deadline = time.monotonic() + 90
        found: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            found = runs(server.url, token)
            if (
                set(found) == names
                and found["llama-sft"]["state"] == "Running"
                and found["crash"]["state"] == "Failed"
            ):
                break
            time.sleep(1)
        assert set(found) == names, server.log.read_text()[-3000:]
        assert found["llama-sft"]["reason"] == "2 of 2 workers running"
        # fails.py raises after 30 steps: its program's failure, and the seed's advice
        assert found["crash"]["reason"] == (
            "Worker crash-0 failed on local: Exited with code 1; the gang does not run without it"
        )
        assert found["crash"]["failedWorker"]["advice"] == {
            "kind": "program",
            "lookAt": "Your program: its log.",
        }
        log = HTTP.get(
            f"{server.url}/v1/tasks/crash-0/logs", headers={"Authorization": f"Bearer {token}"}
        ).json()["logs"]
        assert "RuntimeError: shard 17 is corrupt" in log
        assert "demo: submitted llama-sft" in server.log.read_text()
