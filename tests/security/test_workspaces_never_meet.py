"""Issue 18's "workspaces never meet", played live: `astraeus up` with its real local agent (two
simulated GPUs), the organisation's admin acting in workspace default, and bob, a member of a
second workspace team-b.

Before issue 18: team-b's run read "Queued behind default-secret-next"; bob gave his run
priority 100 (any number up to 100 was taken) and it preempted default's run, whose reason then
read "Preempted by higher-priority work (b-urgent)"; pendingReasons listed every machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.live import Api, Server, serving
from tests.support import WORKLOAD_PYTHON

ASTRA = str(Path(sys.executable).parent / "astra")
SLEEP = [WORKLOAD_PYTHON, "-c", "import time; time.sleep(600)"]
OTHER = "a run of another workspace"
# Everything of a run a member may read, through GraphQL.
RUNS = """{ runs(all: true) { name state reason priority
  workers { name reason } history { reason } pendingReasons { machine reason } } }"""
EVENTS = "{ events(limit: 500) { events { run worker reason } } }"


class Member(Api):
    def submit(self, **spec: Any) -> list[dict[str, Any]]:
        created = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { code field message } } }",
            s={"restart_policy": "never", "command": SLEEP, **spec},
        )
        return list(created["createRun"]["errors"])

    def run(self, name: str) -> dict[str, Any]:
        return dict(self.get(f"/jobs/{name}"))

    def everything_seen(self, workspace: str) -> str:
        """Every sentence this member can read: GraphQL runs (reasons, workers, history,
        per-machine reasons) and events, REST jobs, tasks and events, and the CLI."""
        runs = self.graphql(RUNS)["runs"]
        seen: list[Any] = [runs, self.graphql(EVENTS)]
        for run in runs:
            seen.append(self.get(f"/jobs/{run['name']}"))
            seen += [self.get(f"/tasks/{w['name']}") for w in run["workers"]]
            seen.append(self.astra("status", run["name"]).stdout)
        seen.append(self.get(f"/orgs/default/workspaces/{workspace}/events"))
        seen.append(self.astra("runs", "-a").stdout)
        return json.dumps(seen)

    def astra(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        env = self.server.env_for(self.token)
        env["HOME"] = str(self.server.log.parent)  # no config file of the developer's
        return subprocess.run(
            [ASTRA, "astraeus", *args], env=env, input=stdin, capture_output=True, text=True
        )


def wait_for(what: str, check: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds}s for {what}"
        time.sleep(0.3)


@dataclass
class Cluster:
    server: Server
    default: Member  # the organisation's admin, acting in workspace default
    team_b: Member  # bob, a member of team-b


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("workspaces")
    options = {"local_agent_gpus": "2", "scheduler_interval": "1s"}
    with serving(root / "data", **options) as (server, _):
        server.cli("workspace", "create", "team-b")
        bob = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]
        default = Member(server, server.admin_token)
        # default's runs hold both GPUs and wait for them: the queue team-b's runs meet.
        assert default.submit(name="default-secret-hog", gpus=2, priority=0) == []
        wait_for(
            "default's hog running",
            lambda: default.run("default-secret-hog")["status"] == "Running",
        )
        assert default.submit(name="default-secret-next", gpus=2, priority=0) == []
        wait_for(
            "default's next run tried",
            lambda: default.run("default-secret-next")["reason"].startswith("No machine fits"),
        )
        yield Cluster(server, default, Member(server, bob))


def test_a_run_queued_behind_another_workspaces_run_is_not_told_its_name(
    cluster: Cluster,
) -> None:
    b = cluster.team_b
    assert b.submit(name="b-small", gpus=1, priority=0) == []
    wait_for("b-small tried", lambda: b.run("b-small")["reason"] != "Run created")
    assert b.run("b-small")["reason"] == f"Queued behind {OTHER}"
    # Its per-machine reasons show the machine its runs may use, and nothing of default's.
    runs = {r["name"]: r for r in b.graphql(RUNS)["runs"]}
    assert [m["machine"] for m in runs["b-small"]["pendingReasons"]] == ["local"]
    seen = b.everything_seen("team-b")
    assert "default-secret" not in seen
    assert OTHER in seen


def test_a_members_priority_over_the_ceiling_is_refused_on_every_path(cluster: Cluster) -> None:
    b = cluster.team_b
    before = b.graphql("{ runs(all: true) { name } }")
    refusal = [
        {"code": "INVALID_SPEC", "field": "priority", "message": "at most 50 in workspace team-b"}
    ]
    assert b.submit(name="b-greedy", gpus=2, priority=51) == refusal
    assert b.submit(name="b-greedy", gpus=2, priority=100) == refusal
    spec = json.dumps({"name": "b-greedy", "gpus": 2, "priority": 100, "command": SLEEP})
    cli = b.astra("submit", "-", stdin=spec)
    assert cli.returncode != 0
    assert "priority: at most 50 in workspace team-b" in cli.stderr
    assert b.graphql("{ runs(all: true) { name } }") == before
    # A member cannot raise it; the organisation's admin can (GraphQL or `astraeus workspace`).
    raised = b.graphql(
        'mutation { setPriorityCeiling(workspace: "team-b", ceiling: 100) '
        "{ workspace { priorityCeiling } errors { code } } }"
    )
    assert raised["setPriorityCeiling"] == {"workspace": None, "errors": [{"code": "FORBIDDEN"}]}
    assert cluster.server.cli("workspace", "ceiling", "team-b", "60").strip() == (
        "workspace team-b: runs may ask for priority up to 60"
    )
    assert (
        b.submit(
            name="b-sixty", gpus=0, cpu=0.1, priority=60, command=[WORKLOAD_PYTHON, "-c", "pass"]
        )
        == []
    )
    assert b.submit(name="b-greedy", gpus=2, priority=61)[0]["message"] == (
        "at most 60 in workspace team-b"
    )
    cluster.server.cli("workspace", "ceiling", "team-b", "50")


def test_a_members_high_priority_does_not_preempt_another_workspaces_run(
    cluster: Cluster,
) -> None:
    a, b = cluster.default, cluster.team_b
    assert b.submit(name="b-urgent", gpus=2, priority=50) == []
    wait_for("b-urgent tried", lambda: b.run("b-urgent")["reason"] != "Run created")
    time.sleep(3)  # three more passes: it would have preempted by now
    assert b.run("b-urgent")["reason"].startswith("No machine fits: none has room now")
    hog = a.run("default-secret-hog")
    assert (hog["status"], hog["reason"]) == ("Running", "1 of 1 worker running")
    assert [h["reason"] for h in hog["history"] if "Preempted" in h["reason"]] == []
    # Nothing either workspace reads names the other's runs.
    assert "default-secret" not in b.everything_seen("team-b")
    seen_by_default = a.everything_seen("default")
    assert "b-urgent" not in seen_by_default and "b-small" not in seen_by_default


def test_only_an_admins_policy_lets_a_run_preempt_another_workspaces_over_its_quota(
    cluster: Cluster,
) -> None:
    a, b, server = cluster.default, cluster.team_b, cluster.server
    # default holds both GPUs; its quota lowered to 1 leaves it over quota. Still, without the
    # admins' policy, b-urgent (team-b, priority 50) does not preempt default's hog (priority 0).
    denied = b.graphql(
        'mutation { setPreemptionPolicy(cluster: "local", preemptOverQuota: true) '
        "{ policy { cluster } errors { code } } }"
    )
    assert denied["setPreemptionPolicy"] == {"policy": None, "errors": [{"code": "FORBIDDEN"}]}
    assert server.cli("workspace", "quota", "default", "--gpus", "1").strip() == (
        "workspace default on local: at most 1 GPU at once"
    )
    time.sleep(3)
    assert a.run("default-secret-hog")["status"] == "Running"
    # The admin allows it: the over-quota run is preempted, and neither side reads a name.
    assert server.cli("cluster", "preemption", "local", "--over-quota", "allow").strip() == (
        "cluster local: runs may preempt other workspaces' runs over their quota"
    )
    preempted = f"Preempted by higher-priority work ({OTHER})"

    def hog_history() -> list[str]:
        return [h["reason"] for h in a.run("default-secret-hog")["history"]]

    wait_for("the hog preempted", lambda: preempted in hog_history())
    wait_for("b-urgent placed", lambda: b.run("b-urgent")["status"] != "Pending")
    assert not [r for r in hog_history() if "b-urgent" in r]
    seen_by_default = a.everything_seen("default")
    assert preempted in seen_by_default
    assert "b-urgent" not in seen_by_default and "b-small" not in seen_by_default
    assert "default-secret" not in b.everything_seen("team-b")
