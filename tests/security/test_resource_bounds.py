"""Issue 18's resource attacks, played live: `astraeus up` with its real local agent, a second
workspace (team-b) with a member token, and one workspace trying to stall the shared machine.

Before issue 18: a spec with a 5 MiB environment value was accepted (its start command was
past gRPC's 4 MiB, and the machine took no command again); a worker's log of one 62 MiB line
was read quadratically on the agent's event loop at each tail (about a minute a tail on a CI
machine), so the machine missed its lease and every workspace's workers on it failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent import logs
from tests.e2e.live import Api, Server, serving
from tests.support import WORKLOAD_PYTHON
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="workloads change user only under an agent running as root"
)

ASTRA = str(Path(sys.executable).parent / "astra")
MIB = 2**20
LEASE_SECONDS = 30

# Prints its mark every half second, until stopped.
STEADY = (
    "import time\n"
    "for i in range(1200):\n"
    "    print(f'TEAM-B step {i}', flush=True)\n"
    "    time.sleep(0.5)\n"
)
# One line of 62 MiB, no newline, then waits: its log is tailed meanwhile.
FLOOD = (
    "import sys, time\n"
    "block = b'z' * 2**20\n"
    "for _ in range(62):\n"
    "    sys.stdout.buffer.write(block)\n"
    "sys.stdout.buffer.flush()\n"
    "time.sleep(600)\n"
)


class Client(Api):
    def submit(self, **spec: Any) -> list[dict[str, Any]]:
        created = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { code field message } } }",
            s=spec,
        )
        return list(created["createRun"]["errors"])

    def status(self, run: str) -> str:
        return str(self.get(f"/jobs/{run}")["status"])

    def worker(self, name: str) -> dict[str, Any]:
        return dict(self.get(f"/tasks/{name}"))

    def tail(self, worker: str) -> tuple[float, str]:
        """How long a tail of 1 000 lines took, and its text."""
        began = time.monotonic()
        answer = httpx.get(
            f"{self.url}/v1/tasks/{worker}/logs?tail=1000", headers=self.headers, timeout=300
        )
        assert answer.status_code == 200, answer.text[:300]
        return time.monotonic() - began, str(answer.json().get("logs", ""))

    def machines(self) -> list[dict[str, Any]]:
        return list(self.graphql("{ machines { name state reason } }")["machines"])


class Cluster:
    def __init__(self, server: Server, default: Client, team_b: Client) -> None:
        self.server, self.default, self.team_b = server, default, team_b


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("bounds")
    # Request bodies up to 8 MiB (1 MiB by default, where a 5 MiB spec is refused unread with
    # 413): the spec's own bounds refuse it, field by field, whatever an admin sets.
    options = {
        "lease_time": f"{LEASE_SECONDS}s",
        "scheduler_interval": "2s",
        "max_body_bytes": str(8 * MIB),
    }
    with serving(root / "data", **options) as (server, _):
        server.cli("workspace", "create", "team-b")
        bob = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]
        yield Cluster(server, Client(server, server.admin_token), Client(server, bob))


def big_spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "restart_policy": "never",
        "environment": {"BIG": "x" * 5 * MIB},
        "command": [WORKLOAD_PYTHON, "-c", "print('never')"],
    }


def test_a_five_mib_spec_is_refused_with_the_field_error_on_each_path(cluster: Cluster) -> None:
    a = cluster.default
    refusal = {
        "code": "INVALID_SPEC",
        "field": "environment.BIG",
        "message": "a value is at most 64 KiB (this one is 5.0 MiB)",
    }
    assert a.submit(**big_spec("big")) == [refusal]
    # The CLI, from a file.
    spec_file = cluster.server.log.parent / "big.json"
    spec_file.write_text(json.dumps(big_spec("big-file")))
    env = cluster.server.env_for(a.token) | {"HOME": str(cluster.server.log.parent)}
    done = subprocess.run(
        [ASTRA, "astraeus", "submit", str(spec_file)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 5, done.stderr
    assert done.stderr.strip().splitlines() == [
        "astra: the run was refused:",
        "  environment.BIG: a value is at most 64 KiB (this one is 5.0 MiB)",
    ]
    # Nothing was written, and the machine still takes commands: a run after it starts.
    runs = a.graphql("{ runs(all: true) { name } }")["runs"]
    assert [r["name"] for r in runs if r["name"].startswith("big")] == []
    assert (
        a.submit(
            name="after-big",
            restart_policy="never",
            command=[WORKLOAD_PYTHON, "-c", "print('started')"],
        )
        == []
    )
    wait_for("the run after the refused spec", lambda: a.status("after-big") == "Completed")


def test_a_62_mib_one_line_log_tailed_four_times_stalls_no_one(cluster: Cluster) -> None:
    a, b = cluster.default, cluster.team_b
    assert (
        b.submit(name="steady", restart_policy="never", command=[WORKLOAD_PYTHON, "-c", STEADY])
        == []
    )
    wait_for("team-b's steady running", lambda: b.status("steady") == "Running")
    assert (
        a.submit(name="flood", restart_policy="never", command=[WORKLOAD_PYTHON, "-c", FLOOD]) == []
    )
    wait_for("default's flood running", lambda: a.status("flood") == "Running")
    assert a.worker("flood-0")["placement"]["machine"] == "local"  # the same machine
    assert b.worker("steady-0")["placement"]["machine"] == "local"
    wait_for("the flood's line", lambda: a.tail("flood-0")[1] != "", 30)
    time.sleep(3)  # 62 MiB through a pipe: well within this

    cut_line = "z" * logs.LINE_BYTES + logs.LINE_CUT.decode()
    with ThreadPoolExecutor(4) as pool:
        tails = list(pool.map(lambda _: a.tail("flood-0"), range(4)))
    for seconds, text in tails:
        assert text.rstrip("\n") == cut_line  # cut at 64 KiB, with its marker
        assert seconds < 10, [round(s, 1) for s, _ in tails]

    # Past a whole lease: the machine stays ready, team-b's worker runs and its log grows.
    seen = b.tail("steady-0")[1].count("\n")
    deadline = time.monotonic() + LEASE_SECONDS + 5
    while time.monotonic() < deadline:
        assert [m["state"] for m in a.machines()] == ["ready"]
        assert b.worker("steady-0")["status"] == "Running"
        assert a.worker("flood-0")["status"] == "Running"
        time.sleep(1)
    assert b.tail("steady-0")[1].count("\n") > seen + 2 * LEASE_SECONDS * 0.8
