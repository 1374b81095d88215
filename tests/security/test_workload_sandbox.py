"""Issue 37's sandbox of a process worker, played live on `astraeus up` and its real local agent
(as root: workloads run as user ids of its own), by hostile workloads of two workspaces.

Before issue 37: a run of workspace B given the user id a run of workspace default had used
read default's 0600 files in /tmp, /var/tmp, /dev/shm and /run/lock (N2); a workload listed
every process of the machine in /proc, other workspaces' command lines with their secrets
included (N6); a fork bomb started its 300 processes, the limit that applied being the
machine's (N5); and a second install's agent ran its workloads as the same users (N9).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.identity import uid_seed
from agent.start import StartSpec
from tests.e2e.live import AgentProcess, Api, Server, serving
from tests.support import WORKLOAD_PYTHON
from tests.support.hostile_workloads import BOMB
from tests.support.sandboxed import uid_range, workload_uids
from tests.support.waiting import wait_for

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="an agent as root sandboxes its workers")
PIDS_MAX = 64

# Workspace default's run: leaves a 0600 file in every shared place and a process that hides
# from its end (a session of its own), then ends.
LEAVE = r"""
import os, subprocess, sys
for place in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
    fd = os.open(place + "/a-secret", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"default's checkpoint")
    os.close(fd)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "a-secret-sleeper"],
                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("left", flush=True)
"""
# Workspace team-b's: looks for them, and reads what it finds.
LOOK = r"""
import os
for place in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
    for name in os.listdir(place):
        try:
            print("found", place + "/" + name, open(place + "/" + name).read(), flush=True)
        except OSError as error:
            print("found", place + "/" + name, error.strerror, flush=True)
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        uid = [line for line in open(f"/proc/{pid}/status") if line.startswith("Uid:")][0]
    except OSError:
        continue
    if pid != str(os.getpid()):
        print("process", uid.split()[1], b" ".join(argv).decode(errors="replace"), flush=True)
print("looked", flush=True)
"""


class Member(Api):
    def submit(self, name: str, script: str, *args: str) -> None:
        created = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }",
            s={
                "name": name,
                "gpus": 1,
                "restart_policy": "never",
                "command": [WORKLOAD_PYTHON, "-c", script, *args],
            },
        )
        assert created["createRun"]["errors"] == []

    def ended(self, name: str) -> dict[str, Any]:
        wait_for(f"{name} ended", lambda: self.get(f"/jobs/{name}")["status"] != "Running")
        wait_for(
            f"{name} ended",
            lambda: self.get(f"/jobs/{name}")["status"] in ("Completed", "Failed", "Stopped"),
            90,
        )
        return dict(self.get(f"/tasks/{name}-0"))

    def log(self, name: str) -> list[str]:
        return str(self.get(f"/tasks/{name}-0/logs?tail=500").get("logs", "")).splitlines()


@dataclass
class Machine:
    server: Server
    default: Member
    team_b: Member
    uid: int  # the one user id its agent gives out: every worker runs as it


@pytest.fixture(scope="module")
def one_uid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    """`astraeus up` whose agent gives out one user id (every worker of both workspaces runs
    as it: the same slot, forced) and at most PIDS_MAX processes a worker."""
    root = tmp_path_factory.mktemp("sandbox")
    uid = uid_range(workload_uids())[0]  # a range of its own, held while this process lives
    options = {
        "local_agent_gpus": "2",
        "scheduler_interval": "1s",
        "agent_workload_uids": f"{uid}-{uid}",
        "agent_workload_pids_max": str(PIDS_MAX),
    }
    with serving(root / "data", **options) as (server, _):
        server.cli("workspace", "create", "team-b")
        bob = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]
        yield Machine(server, Member(server, server.admin_token), Member(server, bob), uid)


@as_root
def test_a_workspace_given_the_user_id_another_used_finds_nothing_of_it(one_uid: Machine) -> None:
    # issue 37 N2
    one_uid.default.submit("leaver", LEAVE)
    assert one_uid.default.ended("leaver")["status"] == "Completed"
    assert one_uid.default.log("leaver") == ["left"]
    one_uid.team_b.submit("looker", LOOK)
    looker = one_uid.team_b.ended("looker")
    assert looker["status"] == "Completed"
    seen = one_uid.team_b.log("looker")
    assert [line for line in seen if line.startswith("found")] == []
    assert [line for line in seen if "a-secret" in line] == []
    assert seen[-1] == "looked"
    # Nothing of it is left on the machine either: its files went with its worker.
    for place in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        left = Path(place, "a-secret")
        assert not left.exists() or left.stat().st_uid != one_uid.uid
    assert [p for p in Path("/proc").glob("[0-9]*/cmdline") if b"a-secret" in _read(p)] == []


@as_root
def test_a_fork_bomb_is_stopped_at_its_process_limit_and_its_end_says_so(
    one_uid: Machine,
) -> None:
    # issue 37 N5
    one_uid.team_b.submit("bomb", BOMB, "300")  # 300 children
    bomb = one_uid.team_b.ended("bomb")
    started, refused = (int(n) for n in one_uid.team_b.log("bomb")[-1].split()[1::2])
    assert started < PIDS_MAX and started + refused == 300
    assert bomb["status"] == "Failed"
    assert bomb["last_failure"]["reason"] == (
        f"Exited with code 1; it reached its limit of {PIDS_MAX} processes and threads"
    )


@as_root
def test_the_machine_says_what_it_enforces(one_uid: Machine) -> None:
    machines = one_uid.default.graphql("{ machines { name isolation isolationNotEnforced } }")
    assert machines["machines"] == [
        {
            "name": "local",
            "isolation": (
                "Enforced: its own unprivileged user, a private /tmp and /var/tmp, a private "
                "/dev/shm, only its own processes in /proc, its own IPC namespace, at most "
                f"{PIDS_MAX} processes and threads, its user id cleaned before another "
                "workspace gets it"
            ),
            "isolationNotEnforced": [],
        }
    ]


@as_root
def test_a_second_install_whose_user_ids_overlap_is_refused(
    one_uid: Machine, tmp_path: Path
) -> None:
    # issue 37 N9
    overlapping = f"{one_uid.uid}-{one_uid.uid + 3}"  # all of the range the test holds
    second = AgentProcess(
        one_uid.server, "second", tmp_path / "second", extra=["--workload-uids", overlapping]
    )
    second.start()
    try:
        assert second.process is not None
        assert second.process.wait(timeout=60) != 0
    finally:
        second.end()
    said = second.log.read_text()
    assert (
        f"astraeus agent: workload user ids {overlapping} overlap {one_uid.uid}-{one_uid.uid}, "
        f"claimed on this machine by the agent of data folder "
    ) in said
    assert "give this one a range of its own (--workload-uids FIRST-LAST)" in said
    machines = one_uid.default.graphql("{ machines { name } }")["machines"]
    assert [m["name"] for m in machines] == ["local"]


@pytest.fixture(scope="module")
def two_workspaces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    root = tmp_path_factory.mktemp("proc")
    with serving(root / "data", local_agent_gpus="2", scheduler_interval="1s") as (server, _):
        server.cli("workspace", "create", "team-b")
        bob = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]
        yield Machine(server, Member(server, server.admin_token), Member(server, bob), 0)


@as_root
def test_a_workload_sees_no_process_but_its_own(two_workspaces: Machine) -> None:
    # issue 37 N6
    default, team_b = two_workspaces.default, two_workspaces.team_b
    default.submit(
        "victim", "import time; print('up', flush=True); time.sleep(600)", "--token=sekrit"
    )
    wait_for("victim up", lambda: default.log("victim") == ["up"])
    team_b.submit("snoop", LOOK)
    assert team_b.ended("snoop")["status"] == "Completed"
    seen = team_b.log("snoop")
    assert [line for line in seen if "sekrit" in line] == []
    # Not root's (the agent, its shims), not the victim's: only its own user's, if any.
    others = {line.split()[1] for line in seen if line.startswith("process")}
    assert len(others) <= 1
    assert seen[-1] == "looked"
    victim = [p for p in Path("/proc").glob("[0-9]*/cmdline") if b"--token=sekrit" in _read(p)]
    assert victim  # it runs all along
    default.graphql('mutation { stopRun(name: "victim") { errors { message } } }')


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


# Connects to each Unix socket it is given; what happened, a line each.
CONNECT = r"""
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print("connected", path, flush=True)
    except OSError as error:
        print("refused", path, error.strerror, flush=True)
"""


@as_root
def test_a_workload_reaches_no_service_through_its_unix_socket(two_workspaces: Machine) -> None:
    # issue 37 N4: PostgreSQL trusts local connections on this machine (its superuser to any
    # user who reaches /run/postgresql); nftables sees no Unix socket.
    sockets = [
        path
        for path in ("/run/postgresql/.s.PGSQL.5432", "/run/mysqld/mysqld.sock")
        if Path(path).is_socket()
    ]
    if not sockets:
        pytest.skip("neither PostgreSQL's nor MariaDB's socket is on this machine")
    for path in sockets:  # the attack would work: anyone may connect
        assert Path(path).stat().st_mode & 0o002
    team_b = two_workspaces.team_b
    team_b.submit("socket-probe", CONNECT, *sockets)
    assert team_b.ended("socket-probe")["status"] == "Completed"
    said = team_b.log("socket-probe")
    assert [line.split()[:2] for line in said] == [["refused", path] for path in sockets]


@as_root
def test_a_command_in_the_machines_tmp_runs_with_its_neighbours(two_workspaces: Machine) -> None:
    # What the command names under the machine's /tmp is bound back into the worker's own
    # /tmp: its folder (a neighbour it imports) and nothing else of the machine's /tmp.
    named = Path(f"/tmp/astraeus-test-named-{os.getpid()}")
    other = Path(f"/tmp/astraeus-test-other-{os.getpid()}")
    for folder in (named, other):
        folder.mkdir(mode=0o755, exist_ok=True)
    (named / "neighbour.py").write_text("WORD = 'neighbour imported'\n")
    (named / "train.py").write_text(
        "import os, neighbour\n"
        "print(neighbour.WORD, flush=True)\n"
        f"print('other seen' if os.path.exists({str(other)!r}) else 'other unseen', flush=True)\n"
    )
    (other / "theirs").write_text("a machine user's file\n")
    try:
        default = two_workspaces.default
        created = default.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }",
            s={
                "name": "from-tmp",
                "gpus": 1,
                "restart_policy": "never",
                "command": [WORKLOAD_PYTHON, str(named / "train.py")],
            },
        )
        assert created["createRun"]["errors"] == []
        assert default.ended("from-tmp")["status"] == "Completed"
        assert default.log("from-tmp") == ["neighbour imported", "other unseen"]
    finally:
        for folder in (named, other):
            for file in folder.iterdir():
                file.unlink()
            folder.rmdir()


# Where it runs, as a workload can read it.
WHERE = r"""
import os
print("home", os.environ.get("HOME"), flush=True)
print("cwd", os.getcwd(), flush=True)
for line in open("/proc/self/cgroup"):
    print("cgroup", line.strip(), flush=True)
print("uid", os.getuid(), flush=True)
"""


@as_root
def test_a_workload_learns_no_worker_number_from_where_it_runs(two_workspaces: Machine) -> None:
    # issue 37 N8: its folder (HOME, its working directory), its control group and its user id
    # were named by its worker's number, which counts every workspace's workers before it
    team_b = two_workspaces.team_b
    team_b.submit("where", WHERE)
    assert team_b.ended("where")["status"] == "Completed"
    said = team_b.log("where")
    run = team_b.graphql('{ run(name: "where") { workers { id } } }')["run"]
    key = run["workers"][0]["id"]
    with contextlib.closing(sqlite3.connect(two_workspaces.server.data_dir / "astraeus.db")) as db:
        (number,) = db.execute("SELECT id FROM workers WHERE name = 'where-0'").fetchone()
    home = next(line.split()[1] for line in said if line.startswith("home "))
    assert key in Path(home).parts
    ours = [line for line in said if line.startswith("cgroup ") and "astraeus" in line]
    assert all(line.rstrip("/").endswith(f"/{key}") for line in ours), ours
    cwd = next(line.split()[1] for line in said if line.startswith("cwd "))
    paths = [home, cwd] + [line.split(":", 2)[2] for line in said if line.startswith("cgroup ")]
    assert str(number) not in {part for path in paths for part in Path(path).parts}, paths
    # its user id: from its opaque id, modulo the agent's range
    uid = int(next(line.split()[1] for line in said if line.startswith("uid ")))
    low, high = uid_range(two_workspaces.server.env["ASTRAEUS_AGENT_WORKLOAD_UIDS"])
    assert uid == low + uid_seed(number, StartSpec(worker_key=key)) % (high - low + 1)
