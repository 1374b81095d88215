"""Issue 17's attacks, played live: `astraeus up` with its real local agent, a second workspace
(team-b) with a member token, and workloads that try to reach past their own worker.

Before issue 17 every one of these worked: team-b's `train` read, stopped and deleted
default's `train-0`; a workload ran as root, read /etc/shadow, the database, the tokens and
another worker's secret file, and lifted its own memory limit; `fill_from` copied any folder
of the machine; a mount path replaced links anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.identity import WorkloadUsers, workload_dir
from backend.cli.astra.graphql_ws import subscribe
from tests.e2e.live import Api, Server, serving
from tests.support import WORKLOAD_PYTHON
from tests.support.sandboxed import uid_range
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="workloads change user only under an agent running as root"
)

# Prints its workspace's mark every half second, until stopped.
TRAIN = (
    "import os, time\n"
    "for i in range(600):\n"
    "    print(f\"{os.environ['MARK']} step {i}\", flush=True)\n"
    "    time.sleep(0.5)\n"
)

# A hostile workload: says who it is, tries each path it was told of, its own cgroup limit, then
# allocates past its limit.
PROBE = r"""
import json, os
print(f"uid {os.getuid()} euid {os.geteuid()} gid {os.getgid()}", flush=True)
for name, path in json.loads(os.environ["TARGETS"]).items():
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        print(f"{name}: READ", flush=True)
    except OSError as error:
        print(f"{name}: refused ({type(error).__name__})", flush=True)
env = {k: v for k, v in os.environ.items() if k.startswith(("ASTRAEUS_AGENT", "SUDO"))}
print(f"agent variables: {sorted(env)}", flush=True)
memory = next(line for line in open("/proc/self/cgroup") if ":memory:" in line)
limit = "/sys/fs/cgroup/memory" + memory.strip().split(":", 2)[2] + "/memory.limit_in_bytes"
try:
    with open(limit, "w") as f:
        f.write("-1")
    print("cgroup limit: WRITTEN", flush=True)
except OSError as error:
    print(f"cgroup limit: refused ({type(error).__name__})", flush=True)
hog = bytearray(400 * 2**20)
print("allocated past the limit", len(hog), flush=True)
"""


class Client(Api):
    def submit(self, **spec: Any) -> list[dict[str, Any]]:
        created = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { field message } } }", s=spec
        )
        return list(created["createRun"]["errors"])

    def change(self, verb: str, run: str) -> None:
        changed = self.graphql(f'mutation {{ {verb}(name: "{run}") {{ errors {{ message }} }} }}')
        assert changed[verb]["errors"] == [], changed

    def status(self, run: str) -> str:
        return str(self.get(f"/jobs/{run}")["status"])

    def log(self, worker: str) -> list[str]:
        return str(self.get(f"/tasks/{worker}/logs?tail=1000").get("logs", "")).splitlines()

    def worker(self, name: str) -> dict[str, Any]:
        return dict(self.get(f"/tasks/{name}"))


class Cluster:
    def __init__(self, server: Server, default: Client, team_b: Client, mounts: Path) -> None:
        self.server, self.default, self.team_b, self.mounts = server, default, team_b, mounts

    @property
    def workers_root(self) -> Path:
        return workload_dir(self.server.data_dir / "agent", WorkloadUsers()) / "workers"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("boundary")
    mounts = root / "mounts"
    mounts.mkdir()
    # The machine's owner allows mount paths under this folder, and fill_from from nowhere.
    options = {"agent_mount_roots": str(mounts), "lease_time": "60s"}
    with serving(root / "data", **options) as (server, _):
        admin = server.admin_token
        server.cli("workspace", "create", "team-b")
        bob = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]
        yield Cluster(server, Client(server, admin), Client(server, bob), mounts)


def train(client: Client, mark: str, **more: Any) -> None:
    errors = client.submit(
        name="train",
        gpus=1,
        restart_policy="never",
        environment={"MARK": mark},
        command=[WORKLOAD_PYTHON, "-c", TRAIN],
        **more,
    )
    assert errors == []


FOLLOW = 'subscription { followLog(worker: "train-0", tail: 3) { text ended } }'


def followed(server: Server, token: str, lines: int) -> list[str]:
    """The first lines a follow of train-0 brings (its last 3, then new ones)."""

    async def read() -> list[str]:
        got: list[str] = []
        chunks = subscribe(server.url, token, FOLLOW)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                assert "errors" not in chunk, chunk
                got += chunk["data"]["followLog"]["text"].splitlines()
                if len(got) >= lines:
                    return got
        return got

    return asyncio.run(asyncio.wait_for(read(), 30))


def memory_limits(client: Client) -> set[float]:
    """The memory limits train-0's samples carry, as this workspace sees them."""
    found = client.get(
        "/metrics/range?metric=task_memory_limit_bytes&match=task:train-0"
        f"&start={int(time.time()) - 600}"
    )
    return {v for series in found["series"] for _, v in series["points"]}


def test_same_named_runs_of_two_workspaces_on_one_machine_see_only_their_own(
    cluster: Cluster,
) -> None:
    a, b = cluster.default, cluster.team_b
    train(a, "DEFAULT", memory_bytes=300 * 2**20)
    wait_for("default's train running", lambda: a.status("train") == "Running")
    train(b, "TEAM-B", memory_bytes=200 * 2**20)
    wait_for("team-b's train running", lambda: b.status("train") == "Running")
    assert a.worker("train-0")["placement"]["machine"] == "local"  # the same machine
    assert b.worker("train-0")["placement"]["machine"] == "local"
    wait_for("both logs", lambda: len(a.log("train-0")) >= 2 and len(b.log("train-0")) >= 2)
    # Logs: each side reads its own worker's lines only (before: team-b read default's).
    assert {line.split()[0] for line in a.log("train-0")} == {"DEFAULT"}
    assert {line.split()[0] for line in b.log("train-0")} == {"TEAM-B"}
    # Follows: each side's lines only.
    assert {line.split()[0] for line in followed(cluster.server, a.token, 6)} == {"DEFAULT"}
    assert {line.split()[0] for line in followed(cluster.server, b.token, 6)} == {"TEAM-B"}
    # Metrics: each side's samples are its own worker's (its own memory limit).
    wait_for("default's samples", lambda: bool(memory_limits(a)), 30)
    wait_for("team-b's samples", lambda: bool(memory_limits(b)), 30)
    assert memory_limits(a) == {300 * 2**20}
    assert memory_limits(b) == {200 * 2**20}

    # team-b stops, then deletes, its train: default's runs on, its log still growing.
    b.change("stopRun", "train")
    wait_for("team-b's train stopped", lambda: b.status("train") == "Stopped")
    b.change("deleteRun", "train")
    seen = len(a.log("train-0"))
    wait_for("default's log growing", lambda: len(a.log("train-0")) > seen + 2, 20)
    assert a.status("train") == "Running"
    assert a.worker("train-0")["status"] == "Running"
    assert {line.split()[0] for line in a.log("train-0")} == {"DEFAULT"}


def test_a_hostile_workload_runs_unprivileged_and_reaches_nothing_but_its_own(
    cluster: Cluster,
) -> None:
    a, b = cluster.default, cluster.team_b
    if a.status("train") != "Running":
        train(a, "DEFAULT")
        wait_for("default's train running", lambda: a.status("train") == "Running")
    (victim,) = [p for p in cluster.workers_root.iterdir() if p.is_dir()]
    data = cluster.server.data_dir
    targets = {
        "/etc/shadow": "/etc/shadow",
        "the server's data folder": str(data),
        "the database": str(data / "astraeus.db"),
        "the admin token": str(data / "admin-token"),
        "the machine token": str(data / "agent-token"),
        "the agent's logs": str(data / "agent" / "logs"),
        "the workers' folder": str(victim.parent),
        "another worker's spec": str(victim / "spec.json"),
        "another worker's payload": str(victim / "payload.json"),
        "another worker's home": str(victim / "home"),
    }
    for path in targets.values():
        assert Path(path).exists(), path  # each is there: a refusal is not an absence
    errors = b.submit(
        name="probe",
        gpus=1,
        memory_bytes=256 * 2**20,
        restart_policy="never",
        environment={"TARGETS": json.dumps(targets)},
        command=[WORKLOAD_PYTHON, "-c", PROBE],
    )
    assert errors == []
    wait_for("the probe ended", lambda: b.status("probe") == "Failed", 90)
    printed = b.log("probe-0")
    uid = int(printed[0].split()[1])
    low, high = uid_range(cluster.server.env["ASTRAEUS_AGENT_WORKLOAD_UIDS"])  # its agent's
    assert low <= uid <= high, printed  # before: uid 0
    assert printed[0].split()[3] == str(uid)  # never root, real or effective
    assert printed[1 : 1 + len(targets)] == [
        f"{name}: refused (PermissionError)" for name in targets
    ]
    assert printed[1 + len(targets)] == "agent variables: []"  # a clean environment
    assert printed[2 + len(targets)] == "cgroup limit: refused (PermissionError)"
    assert "allocated past the limit" not in "\n".join(printed)
    probe = b.worker("probe-0")
    assert (probe["exit_code"], probe["last_failure"]["reason"]) == (
        137,
        "OOMKilled: the container exceeded its memory limit",
    )
    assert a.status("train") == "Running"  # the victim never noticed


def ended_before_starting(client: Client, name: str, mounts: list[dict[str, str]]) -> str:
    """Submit a run with these mounts; the reason its worker ended with before it started."""
    errors = client.submit(
        name=name,
        gpus=1,
        restart_policy="never",
        mounts=mounts,
        command=[WORKLOAD_PYTHON, "-c", "print('never runs')"],
    )
    assert errors == []
    wait_for(f"{name} ended", lambda: client.status(name) == "Failed")
    assert client.log(f"{name}-0") == []  # its command never ran
    return str(client.worker(f"{name}-0")["last_failure"]["reason"])


def test_fill_from_outside_the_allowed_folders_is_refused_and_copies_nothing(
    cluster: Cluster,
) -> None:
    mount = {"drive": "loot", "path": str(cluster.mounts / "loot"), "fill_from": "/etc"}
    reason = ended_before_starting(cluster.team_b, "thief", [mount])
    assert reason == "fill_from is not allowed on this machine"
    drives = cluster.workers_root.parent / "drives"
    assert not list(drives.rglob("loot"))  # nothing was copied
    assert not (cluster.mounts / "loot").exists()


def test_a_mount_path_over_an_existing_link_is_refused_and_the_link_kept(
    cluster: Cluster,
) -> None:
    link = cluster.mounts / "shared"
    link.symlink_to("/etc")
    reason = ended_before_starting(
        cluster.team_b, "squatter", [{"drive": "mine", "path": str(link)}]
    )
    assert reason == "mounts[0].path already exists on this machine"
    assert link.is_symlink() and os.readlink(link) == "/etc"  # nothing changed


def test_a_mount_path_outside_the_allowed_folders_is_refused(cluster: Cluster) -> None:
    planted = "/usr/local/bin/astraeus-planted"
    reason = ended_before_starting(cluster.team_b, "planter", [{"drive": "mine", "path": planted}])
    assert reason == (
        "mounts[0].path must be relative (under the worker's own folder) or under a folder "
        f"this machine allows: {cluster.mounts.resolve()}"
    )
    assert not os.path.lexists(planted)


def test_device_and_astraeus_variables_and_control_characters_are_refused(
    cluster: Cluster,
) -> None:
    b = cluster.team_b
    refused = b.submit(
        name="sneaky",
        gpus=1,
        environment={"NVIDIA_VISIBLE_DEVICES": "all", "ASTRAEUS_PROGRESS_FILE": "/etc/passwd"},
        command=[WORKLOAD_PYTHON, "-c", "print(1)\x00"],
    )
    fields = {e["field"]: e["message"] for e in refused}
    assert set(fields) == {
        "environment.NVIDIA_VISIBLE_DEVICES",
        "environment.ASTRAEUS_PROGRESS_FILE",
        "command[2]",
    }
    assert fields["command[2]"] == "must not contain control characters (found U+0000)"
    assert b.get("/jobs/sneaky")["code"] == "JOB_NOT_FOUND"  # nothing was written


# Burns CPU for 3 s of wall time, then says what share of a core it got.
BURN = (
    "import os, time\n"
    "start, cpu = time.monotonic(), os.times()\n"
    "while time.monotonic() - start < 3: pass\n"
    "used = os.times()\n"
    "share = (used.user - cpu.user + used.system - cpu.system) / (time.monotonic() - start)\n"
    "print(f'share {share:.2f}', flush=True)\n"
)


def test_the_cpu_asked_for_is_all_a_worker_gets(cluster: Cluster) -> None:
    b = cluster.team_b
    errors = b.submit(
        name="burner", cpu=0.25, restart_policy="never", command=[WORKLOAD_PYTHON, "-c", BURN]
    )
    assert errors == []
    wait_for("the burner ended", lambda: b.status("burner") == "Completed")
    (line,) = b.log("burner-0")
    assert float(line.split()[1]) <= 0.3, line  # before: a whole core (about 1.0)
