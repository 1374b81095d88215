"""The production topology without Docker (issue 9): PostgreSQL and Redis, two API processes,
two Dramatiq worker processes, the scheduler and an agent on loopback. PostgreSQL and Redis are
servers of this module's own (tests/e2e/services.py), so that the fault tests can kill them.

A run submitted through one replica runs on the agent connected to the other; its log is
fetched through either (the request reaches the replica holding the machine's stream over
Redis); the per-minute tick, sent also several times over by hand to the two workers' four
threads, never counts a second twice: the run's GPU-seconds are exactly its GPUs times the
time from submission to the mark. Then each part is killed in the middle of ticks and log
follows: an API replica, a worker, the agent, Redis, PostgreSQL.

Issue 37's attacks are played through it too: a squatted MASTER_PORT range (N3, first: the
gang needs both GPUs), then hostile logs, probes of the control plane, costly documents, a fork
bomb and a second install on m1's user ids (N7, N4/N6/N2, N1, N5, N9).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.live import free_port, master_ports
from tests.e2e.services import MISSING, PrivatePostgres, PrivateRedis
from tests.support.graphql_attacks import ATTACKS, HEALTHZ_S, SENDERS, attack
from tests.support.hostile_log import HOSTILE_LOG, HOSTILE_SHOWN, HOSTILE_WRITTEN
from tests.support.hostile_workloads import BOMB, RENDEZVOUS, SQUAT
from tests.support.http import HTTP
from tests.support.sandboxed import end_workloads, uid_range, workload_uids
from tests.workloads.ledger import HISTORIES, INTERVALS, at, check_ledger

ASTRAEUS = str(Path(sys.executable).parent / "astraeus")
ASTRA = str(Path(sys.executable).parent / "astra")

pytestmark = pytest.mark.skipif(bool(MISSING), reason=MISSING)

# A line every half second and a step each time, for ten minutes.
STEADY = """\
import time, astraeus_progress
for i in range(1200):
    print(f"line {i}", flush=True)
    astraeus_progress.report(i)
    time.sleep(0.5)
"""
# The most processes and threads m1 gives a worker (--workload-pids-max; its default is 8192).
PIDS_MAX = 200
ENDED = ("Completed", "Failed", "Stopped")


@dataclass
class Topology:
    postgres: PrivatePostgres
    redis: PrivateRedis
    root: Path
    env: dict[str, str]
    admin: str = ""
    apis: list[str] = field(default_factory=list)  # base URLs
    agent_ports: list[int] = field(default_factory=list)
    master_ports: tuple[int, int] = (0, 0)  # the range MASTER_PORT is given from
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, tuple[tuple[str, ...], dict[str, str]]] = field(default_factory=dict)
    victim: Member | None = None  # the squatted gang's owner (team-b's bob)

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [ASTRAEUS, *args], env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        self.processes[name] = process
        self.commands[name] = (args, env)
        return process

    def kill(self, name: str) -> None:
        """As a machine or a process dies: SIGKILL, no goodbye."""
        self.processes[name].kill()
        self.processes[name].wait()

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        args, env = self.commands[name]
        return self.start(name, *args, **env)

    @property
    def database_url(self) -> str:
        return self.postgres.url

    def cli(self, *args: str) -> str:
        return subprocess.run(
            [ASTRAEUS, *args], env=self.env, capture_output=True, text=True, check=True
        ).stdout

    def graphql(self, api: int, query: str, **variables: Any) -> dict[str, Any]:
        return Member(self.apis[api], self.admin).graphql(query, **variables)

    def get(self, api: int, path: str) -> httpx.Response:
        return HTTP.get(
            f"{self.apis[api]}/v1{path}",
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=30,
        )

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.root.glob("*.log"))
        )


@dataclass
class Member:
    """A user's calls through one replica, with a token of theirs."""

    url: str  # the replica's base URL
    token: str

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        answer = HTTP.post(
            f"{self.url}/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        ).json()
        assert not answer.get("errors"), answer
        return dict(answer["data"])

    def submit(self, spec: dict[str, Any]) -> None:
        created = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }", s=spec
        )
        assert created["createRun"]["errors"] == [], created

    def get(self, path: str) -> Any:
        answer = HTTP.get(
            f"{self.url}/v1{path}", headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def log(self, worker: str) -> str:
        """Its log so far; empty until it is placed."""
        answer = HTTP.get(
            f"{self.url}/v1/tasks/{worker}/logs?tail=1000",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        return str(answer.json().get("logs") or "") if answer.status_code == 200 else ""


def healthy(url: str, process: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, "the process ended"
        try:
            if HTTP.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    root = tmp_path_factory.mktemp("topology")
    postgres, broker = PrivatePostgres(), PrivateRedis(root)
    t = Topology(postgres, broker, root, env={})
    # a hundred ports of its own, held while the module runs: another lane's gangs (and its
    # squatter, test_a_squatted_master_port_range_fails_no_gang) stay out of them
    ports, held = master_ports()
    uids = workload_uids()  # its agent's own: another lane's agent may hold the default range
    first, _, last = ports.partition("-")
    t.master_ports = (int(first), int(last))
    try:
        postgres.start()
        postgres.create_database()
        broker.start()
        t.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")},
            "ASTRAEUS_DATABASE_URL": postgres.url,
            "ASTRAEUS_BROKER": "redis",
            "ASTRAEUS_REDIS_URL": broker.url,
            "ASTRAEUS_DATA_DIR": str(root / "data"),
            "ASTRAEUS_CONSOLE_DIR": str(root / "no-console"),
            "ASTRAEUS_SCHEDULER_INTERVAL": "1s",
            "ASTRAEUS_LOG_LEVEL": "warning",
            "ASTRAEUS_MASTER_PORTS": ports,
        }
        t.cli("db", "upgrade")
        printed = t.cli("bootstrap")
        found = re.search(r"token:\s+(astx_\S+)", printed)
        assert found, printed
        t.admin = found.group(1)
        for i in range(2):
            port, agent_port = free_port(), free_port()
            t.apis.append(f"http://127.0.0.1:{port}")
            t.agent_ports.append(agent_port)
            api = t.start(
                f"api-{i}", "serve", ASTRAEUS_PORT=str(port), ASTRAEUS_AGENT_PORT=str(agent_port)
            )
            healthy(t.apis[i], api)
        for i in range(2):
            t.start(f"worker-{i}", "worker", "--threads", "2")
        t.start("scheduler", "scheduler")
        token = t.root / "m1.token"
        token.write_text(t.cli("token", "create", "--agent", "--name", "m1"))
        t.start(  # the machine's stream goes to the first replica only
            "agent",
            "agent",
            "--server",
            f"127.0.0.1:{t.agent_ports[0]}",
            "--token-file",
            str(token),
            "--name",
            "m1",
            "--data-dir",
            str(root / "m1"),
            "--simulate-gpus",
            "2",
            "--heartbeat",
            "1",
            "--sample",
            "1",
            "--workload-uids",
            uids,
            "--workload-pids-max",  # test_a_fork_bomb_is_stopped_at_its_process_limit
            str(PIDS_MAX),
        )
        yield t
    finally:
        for process in t.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in t.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        # an agent that stops leaves its workloads running, for the next to take up: none will
        end_workloads(uids)
        broker.stop()
        postgres.stop()
        os.close(held)


def until(check: Any, seconds: float, what: str, topology: Topology) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what}, in {seconds:g} s\n{topology.logs()}")


def test_a_squatted_master_port_range_fails_no_gang(topology: Topology) -> None:
    # issue 37 N3 on this topology: a workload holds every port it can of the range the
    # scheduler gives out as MASTER_PORT; then a gang of another workspace, two ranks of one GPU
    # each on m1, meets it at its rendezvous. Before issue 37 its rank 0 failed ("Address
    # already in use") and the run was charged failure. First in the module: "steady" holds
    # both GPUs from the next test on.
    t = topology
    first, last = t.master_ports
    squatter = Member(t.apis[0], t.admin)
    squat = ["python3", "-c", SQUAT, str(first), str(last), "600"]
    squatter.submit({"name": "squat", "restart_policy": "never", "command": squat})
    holding = until(
        lambda: re.search(r"holding (\d+)", squatter.log("squat-0")),
        60,
        "the squatter never held its ports",
        t,
    )
    assert int(holding.group(1)) >= (last - first + 1) * 9 // 10  # of 200, IPv4 and IPv6
    t.cli("workspace", "create", "team-b")
    bob = t.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]
    victim = Member(t.apis[1], bob)
    victim.submit(
        {
            "name": "rendezvous",
            "workers": 2,
            "gpus": 1,
            "restart_policy": "never",
            "command": ["python3", "-c", RENDEZVOUS],
        }
    )
    job = until(
        lambda: (found := victim.get("/jobs/rendezvous"))["status"] in ENDED and found,
        180,
        "the gang never ended",
        t,
    )
    squatter.graphql('mutation { stopRun(name: "squat") { errors { message } } }')
    assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed"), job
    workers = victim.graphql(
        '{ run(name: "rendezvous") { workers { name restarts history { state reason } } } }'
    )["run"]["workers"]
    assert [w["restarts"] for w in workers] == [0, 0]
    reasons = [h["reason"] for w in workers for h in w["history"]]
    assert any(r.startswith("MASTER_PORT ") for r in reasons), reasons  # it met the squat
    assert not [h for w in workers for h in w["history"] if h["state"] == "Failed"], workers
    # rank 0 listened on the port m1 held for the gang, outside the range; rank 1 reached it
    said = victim.log("rendezvous-0")
    port = int(said.split("rank 0 of 2: joined at ", 1)[1].split()[0].rpartition(":")[2])
    assert not first <= port <= last, said
    assert "rank 0 met rank 1 of rendezvous" in said
    assert "met rank 0 of rendezvous" in victim.log("rendezvous-1")
    t.victim = victim


def counted_to_the_end(t: Topology, member: Member, run: str) -> tuple[Any, list[Any]]:
    """The ended run's workers' histories, and its intervals once the tick (sent every five
    seconds beside the scheduler's) has counted every worker to its end."""
    from dramatiq.brokers.redis import RedisBroker

    history = member.graphql(HISTORIES, run=run)["run"]
    ends = {w["name"]: at(w["history"][0]["transitionAt"]) for w in history["workers"]}
    broker = RedisBroker(url=t.redis.url)
    try:
        deadline = time.monotonic() + 200
        while True:
            broker.enqueue(_message("accounting.tick"))
            intervals: list[Any] = member.graphql(INTERVALS, run=run)["goodputIntervals"]
            last: dict[str, datetime] = {}
            for i in intervals:
                last[i["worker"]] = max(last.get(i["worker"], at(i["end"])), at(i["end"]))
            if all(w in last and last[w] >= e - timedelta(seconds=1) for w, e in ends.items()):
                return history, intervals
            assert time.monotonic() < deadline, f"{run} never counted to its end\n{t.logs()}"
            time.sleep(5)
    finally:
        broker.close()


def test_two_replicas_two_workers_one_agent(topology: Topology) -> None:
    t = topology
    # submitted through the second replica; the agent's stream is held by the first
    spec = {"name": "steady", "gpus": 2, "command": ["python3", "-c", STEADY]}
    created = t.graphql(
        1,
        "mutation($s: JSON!) { createRun(spec: $s) { run { name } errors { message } } }",
        s=spec,
    )
    assert created["createRun"]["errors"] == []
    until(
        lambda: t.get(1, "/jobs/steady").json().get("status") == "Running",
        60,
        "steady never ran",
        t,
    )
    # the log, asked of either replica: the second routes it to the first over Redis
    for api in (0, 1):
        logs = until(
            lambda api=api: "line 3" in t.get(api, "/tasks/steady-0/logs?tail=50").text,
            20,
            f"replica {api} never got the log",
            t,
        )
        assert logs


def test_a_workloads_escape_sequences_reach_no_terminal(topology: Topology) -> None:
    # issue 37 N7 on this topology: the log asked of the replica without the machine's stream
    # (over Redis); the API answers what the workload wrote, astra shows it by markers
    t = topology
    created = t.graphql(
        1,
        "mutation($s: JSON!) { createRun(spec: $s) { run { name } errors { message } } }",
        s={"name": "escapes", "restart_policy": "never", "command": ["python3", "-c", HOSTILE_LOG]},
    )
    assert created["createRun"]["errors"] == []
    until(
        lambda: t.get(1, "/jobs/escapes").json().get("status") == "Completed",
        60,
        "escapes never completed",
        t,
    )
    assert t.get(1, "/tasks/escapes-0/logs").json()["logs"] == HOSTILE_WRITTEN
    env = {**t.env, "API": f"{t.apis[1]}/v1", "ASTRA_TOKEN": t.admin}
    printed = subprocess.run(
        [ASTRA, "astraeus", "logs", "escapes-0"], env=env, capture_output=True, text=True
    )
    assert (printed.returncode, printed.stdout) == (0, HOSTILE_SHOWN)


# A workload that tries the control plane's ports on loopback (PostgreSQL, Redis, both API
# replicas and their agent endpoints), then looks for other processes and the machine's /tmp.
PROBE = """\
import os, socket, sys
for port in sys.argv[1:]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
        print("reached", port, flush=True)
    except OSError:
        print("refused", port, flush=True)
mine = os.getuid()
others = set()
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    try:
        others |= {os.stat(f"/proc/{pid}").st_uid} - {mine}
    except OSError:
        pass
print("other users' processes", len(others), flush=True)
print("in /tmp", sorted(os.listdir("/tmp")), flush=True)
"""


def test_a_workload_reaches_no_service_of_the_control_plane_and_sees_no_process(
    topology: Topology,
) -> None:
    # issue 37 N4, N6, N2 on this topology: its PostgreSQL, Redis, API replicas and agent
    # endpoints all listen on this machine's loopback, where its workloads run
    t = topology
    ports = [t.postgres.port, t.redis.port] + [int(u.rsplit(":", 1)[1]) for u in t.apis]
    ports += t.agent_ports
    created = t.graphql(
        1,
        "mutation($s: JSON!) { createRun(spec: $s) { run { name } errors { message } } }",
        s={
            "name": "probe",
            "restart_policy": "never",
            "command": ["python3", "-c", PROBE, *map(str, ports)],
        },
    )
    assert created["createRun"]["errors"] == []
    until(
        lambda: t.get(1, "/jobs/probe").json().get("status") == "Completed",
        60,
        "probe never completed",
        t,
    )
    said = t.get(1, "/tasks/probe-0/logs").json()["logs"].splitlines()
    assert said == [
        *(f"refused {port}" for port in ports),
        "other users' processes 0",
        "in /tmp []",
    ]


# Where it runs, as a workload can read it.
WHERE = """\
import os
print(os.environ["HOME"], flush=True)
print(os.getcwd(), flush=True)
"""


def test_ids_count_nothing_and_both_replicas_show_the_same(topology: Topology) -> None:
    # issue 37 N8 on this topology: ids are sealed under the install's key, which each replica,
    # worker and the scheduler read from PostgreSQL; the workload's folder is named by its
    # worker's opaque id, not its number
    t = topology
    created = t.graphql(
        0,
        "mutation($s: JSON!) { createRun(spec: $s) { run { id workers { id } } "
        "errors { message } } }",
        s={"name": "where", "restart_policy": "never", "command": ["python3", "-c", WHERE]},
    )["createRun"]
    assert created["errors"] == []
    run_id, worker_id = created["run"]["id"], created["run"]["workers"][0]["id"]
    for api in (0, 1):
        seen = t.graphql(api, '{ run(name: "where") { id workers { id } } }')["run"]
        assert (seen["id"], seen["workers"][0]["id"]) == (run_id, worker_id)
    with psycopg.connect(t.database_url) as conn:
        row = conn.execute("SELECT run_id, id FROM workers WHERE name = 'where-0'").fetchone()
    assert row is not None
    numbers = {str(n) for n in row}
    assert not {run_id, worker_id} & numbers and not run_id.isdigit()
    until(
        lambda: t.get(1, "/jobs/where").json().get("status") == "Completed",
        60,
        "where never completed",
        t,
    )
    home, cwd = t.get(1, "/tasks/where-0/logs").json()["logs"].splitlines()
    assert worker_id in Path(home).parts
    assert not numbers & {*Path(home).parts, *Path(cwd).parts}, (home, cwd)
    # its events: the same opaque ids from either replica (the REST shim)
    listed = [
        [
            e["id"]
            for e in t.get(api, "/orgs/default/workspaces/default/events?name=where").json()[
                "events"
            ]
        ]
        for api in (0, 1)
    ]
    assert listed[0] == listed[1] and listed[0]
    assert not any(i.isdigit() for i in listed[0])


def test_documents_costly_in_their_expansion_stall_no_replica(topology: Topology) -> None:
    # issue 37 N1 on this topology: the fragment fan-out and its variants, ten at a time,
    # without a token and with one, refused while both replicas' /healthz answer within 1 s
    # (the megabyte of commas is past this topology's body limit: refused unread, 413)
    t = topology
    documents = {name: query for name, (query, _) in ATTACKS.items() if len(query) < 2**20}
    for token in (None, t.admin):
        for url in t.apis:
            measured = attack(url, token, documents)
            assert len(measured.answers) == SENDERS * len(documents)
            for name, status, body in measured.answers:
                assert status == 200 and body.get("data") is None, (name, body)
                wanted = "A valid API token is required" if token is None else ATTACKS[name][1]
                assert wanted in body["errors"][0]["message"], (name, body)
            assert max(measured.healthz) < HEALTHZ_S, sorted(measured.healthz)[-5:]


def test_a_fork_bomb_is_stopped_at_its_process_limit(topology: Topology) -> None:
    # issue 37 N5 on this topology: a workload forks twice m1's limit of processes and threads
    # a worker (--workload-pids-max); its forks fail at the limit, its end says so, and the
    # machine (its agent, the control plane's processes beside it) goes on untouched
    t = topology
    bomber = Member(t.apis[1], t.admin)
    bomb = ["python3", "-c", BOMB, str(2 * PIDS_MAX)]
    bomber.submit({"name": "bomb", "restart_policy": "never", "command": bomb})
    until(
        lambda: bomber.get("/jobs/bomb")["status"] in ENDED and bomber.log("bomb-0"),
        90,
        "the bomb never ended",
        t,
    )
    started, refused = (int(n) for n in bomber.log("bomb-0").split()[1::2])
    assert PIDS_MAX - 10 <= started < PIDS_MAX and started + refused == 2 * PIDS_MAX
    task = bomber.get("/tasks/bomb-0")
    assert task["status"] == "Failed"
    assert task["last_failure"]["reason"] == (
        f"Exited with code 1; it reached its limit of {PIDS_MAX} processes and threads"
    )
    assert {name: p.poll() for name, p in t.processes.items()} == dict.fromkeys(t.processes)
    machines = t.graphql(0, "{ machines { name state isolation } }")["machines"]
    assert [(m["name"], m["state"]) for m in machines] == [("m1", "ready")]
    assert f"at most {PIDS_MAX} processes and threads" in machines[0]["isolation"]


# A worker that says which user it runs as, then a line every half second for ten minutes.
KEEPS_RUNNING = """\
import os, time
print("uid", os.getuid(), flush=True)
for i in range(1200):
    print(f"line {i}", flush=True)
    time.sleep(0.5)
"""


def test_a_second_install_whose_user_ids_overlap_is_refused(topology: Topology) -> None:
    # issue 37 N9 on this topology: another install's agent (its own data folder, its own
    # machine name) started on this machine with m1's user ids, as two installs on their
    # default range would be; before issue 37 it ran its workloads as m1's workers' users
    t = topology
    args = t.commands["agent"][0]
    uids = args[args.index("--workload-uids") + 1]
    first, last = uid_range(uids)
    owner = Member(t.apis[0], t.admin)
    owner.submit(
        {"name": "keeper", "restart_policy": "never", "command": ["python3", "-c", KEEPS_RUNNING]}
    )
    said = until(
        lambda: re.search(r"uid (\d+)\n(?:.*\n)*line 2\n", owner.log("keeper-0")),
        60,
        "keeper never ran",
        t,
    )
    assert first <= int(said.group(1)) <= last  # one of m1's users
    token = t.root / "second.token"
    token.write_text(t.cli("token", "create", "--agent", "--name", "second"))
    second = t.start(
        "second",
        "agent",
        "--server",
        f"127.0.0.1:{t.agent_ports[1]}",
        "--token-file",
        str(token),
        "--name",
        "second",
        "--data-dir",
        str(t.root / "second"),
        "--simulate-gpus",
        "2",
        "--heartbeat",
        "1",
        "--workload-uids",
        uids,
    )
    assert second.wait(timeout=60) != 0
    refused = (t.root / "second.log").read_text()
    assert (
        f"astraeus agent: workload user ids {uids} overlap {uids}, claimed on this machine by "
        f"the agent of data folder {(t.root / 'm1').resolve()} (pid "
    ) in refused, refused
    assert "give this one a range of its own (--workload-uids FIRST-LAST)" in refused
    # m1 runs its worker on, as the same user; no machine "second" joined
    seen = owner.log("keeper-0").count("\n")
    until(lambda: owner.log("keeper-0").count("\n") > seen + 4, 20, "keeper stopped", t)
    assert owner.get("/jobs/keeper")["status"] == "Running"
    assert t.processes["agent"].poll() is None
    machines = t.graphql(0, "{ machines { name state } }")["machines"]
    assert machines == [{"name": "m1", "state": "ready"}], machines
    owner.graphql('mutation { stopRun(name: "keeper") { errors { message } } }')


def ticks_until(t: Topology, done: Any, seconds: float = 150) -> dict[str, Any]:
    """Four extra ticks every five seconds, beside the scheduler's, until ``done`` holds of
    what is counted."""
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=t.redis.url)
    try:
        deadline = time.monotonic() + seconds
        while True:
            for _ in range(4):
                broker.enqueue(_message("accounting.tick"))
            counted = _counted(t.database_url)
            if counted and done(counted):
                return counted
            assert time.monotonic() < deadline, t.logs()
            time.sleep(5)
    finally:
        broker.close()


def conserved(t: Topology) -> None:
    """Conservation to the second: 2 GPUs times the time from submission to the mark, once."""
    time.sleep(3)  # let any tick in flight commit
    counted = _counted(t.database_url)
    assert counted is not None
    expected = 2 * (counted["mark"] - counted["created"]).total_seconds()
    assert counted["run_seconds"] == pytest.approx(expected, abs=1e-6), _evidence(t.database_url)
    assert counted["workspace_seconds"] == pytest.approx(expected, abs=1e-6)


def test_ticks_of_four_threads_count_each_second_once(topology: Topology) -> None:
    # "steady" (test_two_replicas_two_workers_one_agent) counted for a minute and a half: the
    # minute's tick, and extra ticks sent by hand, duplicates taken by the two workers' four
    # threads. After the tests between, whose runs hold no GPU: their seconds are part of the
    # wait for that minute and a half (issue 39), not added to it.
    t = topology
    ticks_until(t, lambda c: c["run_seconds"] > 0 and c["minutes"] >= 1.5)
    conserved(t)


def test_a_gang_that_met_the_squat_is_charged_no_failure(topology: Topology) -> None:
    # The squatted gang's ledger (test_a_squatted_master_port_range_fails_no_gang's run), to
    # the second against its workers' histories. Read after "steady"'s minutes of ticks
    # (test_ticks_of_four_threads_count_each_second_once): the minute of the gang's end is
    # counted by then, where read at once it was waited for, 30 s on average (issue 39).
    t = topology
    victim = t.victim
    assert victim is not None, "test_a_squatted_master_port_range_fails_no_gang ran first"
    history, intervals = counted_to_the_end(t, victim, "rendezvous")
    ledger = check_ledger(victim, "rendezvous", history, intervals)
    assert [g["gpuHours"] for g in ledger["gpuHours"] if g["category"] == "failure"] in ([], [0])
    assert not [i for i in intervals if i["category"] == "failure"], intervals


def test_the_replica_holding_the_stream_dies(topology: Topology) -> None:
    # issue 9: kill an API replica in the middle of log requests; the other says clearly why it
    # cannot fetch the log, and once the replica is back the agent reconnects by itself
    t = topology
    t.kill("api-0")
    answer = t.get(1, "/tasks/steady-0/logs?tail=5")
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "TASK_LOG_UNAVAILABLE"
    assert answer.json()["message"] == (
        "The log of steady-0 could not be fetched: its machine did not answer."
    )
    assert t.get(1, "/jobs/steady").json()["status"] == "Running"  # the run goes on
    healthy(t.apis[0], t.restart("api-0"))
    until(
        lambda: t.get(1, "/tasks/steady-0/logs?tail=5").status_code == 200,
        60,
        "the agent never came back to the restarted replica",
        t,
    )


def test_a_worker_and_the_agent_die_in_the_middle_of_ticks(topology: Topology) -> None:
    # issue 9: kill a Dramatiq worker and the agent while ticks go on: nothing is counted
    # twice or lost, the run keeps running (its process outlives the agent), logs come back
    t = topology
    before = _counted(t.database_url)
    assert before is not None
    t.kill("worker-0")
    t.kill("agent")
    # The agent back within a third of its lease, the mark moved or not (the tick counts whole
    # minutes: it may take a minute to move, and an agent gone for its lease is a machine
    # lost, its run queued again, as it should be: CI, under load, 2026-12-05)
    killed = time.monotonic()
    ticks_until(t, lambda c: c["mark"] > before["mark"] or time.monotonic() - killed > LEASE_S / 3)
    t.restart("agent")
    ticks_until(t, lambda c: c["mark"] > before["mark"])  # and ticks went on without worker-0
    t.restart("worker-0")
    until(
        lambda: "line" in t.get(1, "/tasks/steady-0/logs?tail=5").text,
        60,
        "the restarted agent never served the log again",
        t,
    )
    assert t.get(0, "/jobs/steady").json()["status"] == "Running"
    ticks_until(t, lambda c: c["minutes"] >= before["minutes"] + 1.5)
    conserved(t)


class Follow:
    """``astra astraeus logs steady-0 -f --tail 0`` through one replica, read as it prints."""

    def __init__(self, t: Topology, api: int) -> None:
        env = {**t.env, "API": f"{t.apis[api]}/v1", "ASTRA_TOKEN": t.admin, "NO_COLOR": "1"}
        self.process = subprocess.Popen(
            [ASTRA, "astraeus", "logs", "steady-0", "-f", "--tail", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def numbers(self) -> list[int]:
        return [int(m.group(1)) for line in self.lines if (m := re.fullmatch(r"line (\d+)", line))]

    def ended(self, seconds: float) -> tuple[int, str]:
        """Its exit status and what it said on stderr, once it has ended by itself."""
        code = self.process.wait(timeout=seconds)
        assert self.process.stderr is not None
        return code, self.process.stderr.read().strip()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=10)


def test_redis_dies_and_comes_back(topology: Topology) -> None:
    # issue 9: Redis killed in the middle of ticks and log follows. It keeps nothing on disk:
    # the queued ticks go with it, and the next ones count what they would have counted.
    t = topology
    before = _counted(t.database_url)
    assert before is not None
    direct, relayed = Follow(t, 0), Follow(t, 1)  # the second is carried through Redis
    try:
        until(lambda: direct.numbers() and relayed.numbers(), 30, "the follows never began", t)
        t.redis.kill()
        # the replica holding the machine's stream answers without Redis; the other says why not
        assert "line" in t.get(0, "/tasks/steady-0/logs?tail=5").json()["logs"]
        answer = t.get(1, "/tasks/steady-0/logs?tail=5")
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "TASK_LOG_UNAVAILABLE"
        assert answer.json()["message"] == (
            "The log of steady-0 could not be fetched: this API replica does not hold its "
            "machine's stream, and Redis, which carries requests between replicas, cannot be "
            "reached."
        )
        code, said = relayed.ended(60)
        assert code == 3  # as when the server cannot be reached: worth trying again
        assert said.endswith(
            "this API replica does not hold its machine's stream, and Redis, which carries "
            "requests between replicas, cannot be reached."
        ), said
        for api in (0, 1):  # what needs only the database goes on
            assert t.get(api, "/jobs/steady").json()["status"] == "Running"
        seen = len(direct.numbers())
        until(lambda: len(direct.numbers()) > seen + 4, 20, "the direct follow stopped", t)
        t.redis.start()
        # the replicas listen and claim their machines' streams again; the workers and the
        # scheduler reconnect: nothing is restarted by hand
        until(
            lambda: t.get(1, "/tasks/steady-0/logs?tail=5").status_code == 200,
            60,
            "the log never came through Redis again",
            t,
        )
        ticks_until(t, lambda c: c["mark"] > before["mark"])
        conserved(t)
        numbers = direct.numbers()
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # no line lost
        assert direct.process.poll() is None
    finally:
        direct.close()
        relayed.close()


def test_postgresql_restarts(topology: Topology) -> None:
    # issue 9: PostgreSQL stopped as by a power cut in the middle of ticks and a log follow,
    # for longer than a machine's lease, then started again (WAL recovery)
    t = topology
    before = _counted(t.database_url)
    assert before is not None
    direct = Follow(t, 0)
    try:
        until(lambda: direct.numbers(), 30, "the follow never began", t)
        t.postgres.crash()
        away = time.monotonic()
        for api in (0, 1):  # a clear error, and one the client may try again
            answer = t.get(api, "/jobs/steady")
            assert answer.status_code == 503, answer.text
            assert answer.json()["code"] == "DATABASE_UNAVAILABLE"
            assert answer.json()["message"] == (
                "Astraeus cannot reach its database just now; try again in a moment."
            )
        status = subprocess.run(
            [ASTRA, "astraeus", "status", "steady"],
            env={**t.env, "API": f"{t.apis[1]}/v1", "ASTRA_TOKEN": t.admin},
            capture_output=True,
            text=True,
        )
        assert (status.returncode, status.stderr) == (
            3,  # as when the server cannot be reached: try again
            "astra: Astraeus cannot reach its database just now; try again in a moment.\n",
        )
        # the machine's heartbeats cannot be written; the follow needs no database
        seen = len(direct.numbers())
        time.sleep(max(0.0, LEASE_S + 5 - (time.monotonic() - away)))
        # the workload writes two lines a second; beside the whole suite on 2 cores fewer came
        # (116 in 65 s): at least one a second came through the outage
        assert len(direct.numbers()) > seen + LEASE_S
        t.postgres.start()
        # every process reconnects by itself; the machine is not taken for lost although its
        # lease ran out while nothing could be written, so the run goes on
        until(lambda: t.get(1, "/jobs/steady").status_code == 200, 60, "the API never came back", t)
        ticks_until(t, lambda c: c["mark"] > before["mark"])
        assert t.get(0, "/jobs/steady").json()["status"] == "Running"
        machine = t.graphql(0, "{ machines { name state } }")["machines"]
        assert machine == [{"name": "m1", "state": "ready"}], machine
        conserved(t)
        numbers = direct.numbers()
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    finally:
        direct.close()


LEASE_S = 60  # the default lease: a machine not heard from for this long is lost


def _message(actor: str) -> Any:
    from dramatiq import Message

    from backend.jobs.broker import QUEUE

    return Message(queue_name=QUEUE, actor_name=actor, args=(), kwargs={}, options={})


def _evidence(url: str) -> str:
    """What a failed conservation check needs to be explained (2026-12-05: steady counted 24 ms
    of GPU time over its two GPUs' held time once, in one fresh-clone CI of 8 lanes, and the
    database went with the topology): steady's history, its intervals and open interval, the
    recounts asked for, and the mark."""
    with psycopg.connect(url) as conn:
        tables = {
            "transitions": "SELECT t.worker_id, t.transition_at, t.state, t.phase, t.gpus, "
            "t.held_gpus, t.accounted FROM state_transitions t JOIN runs r ON r.id = t.run_id "
            "WHERE r.name = 'steady' ORDER BY t.transition_at, t.id",
            "intervals": "SELECT i.start_at, i.end_at, i.category, i.held, i.gpus "
            "FROM goodput_intervals i JOIN runs r ON r.id = i.run_id WHERE r.name = 'steady' "
            "ORDER BY i.start_at, i.id",
            "open": "SELECT o.start_at, o.phase, o.category, o.gpus FROM goodput_open_intervals "
            "o JOIN runs r ON r.id = o.run_id WHERE r.name = 'steady'",
            "recounts": "SELECT * FROM goodput_recounts",
            "mark": "SELECT counted_until FROM accounting_marks",
        }
        return "\n".join(
            f"{name}: {conn.execute(query).fetchall()}"  # type: ignore[arg-type]
            for name, query in tables.items()
        )


def _counted(url: str) -> dict[str, Any] | None:
    with psycopg.connect(url) as conn:
        mark = conn.execute("SELECT counted_until FROM accounting_marks").fetchone()
        run = conn.execute(
            "SELECT id, created_at, workspace_id FROM runs WHERE name = 'steady'"
        ).fetchone()
        if not mark or not mark[0] or not run:
            return None
        run_seconds = conn.execute(
            "SELECT coalesce(sum(gpu_seconds), 0) FROM goodput_hours "
            "WHERE scope = 'run' AND scope_id = %s",
            (run[0],),
        ).fetchone()[0]  # type: ignore[index]
        # steady's workspace's, the only run of it with GPUs (team-b's gang ran before it)
        workspace_seconds = conn.execute(
            "SELECT coalesce(sum(gpu_seconds), 0) FROM goodput_hours "
            "WHERE scope = 'workspace' AND scope_id = %s",
            (run[2],),
        ).fetchone()[0]  # type: ignore[index]
    created: datetime = run[1]
    return {
        "mark": mark[0],
        "created": created,
        "minutes": (mark[0] - created).total_seconds() / 60,
        "run_seconds": float(run_seconds),
        "workspace_seconds": float(workspace_seconds),
    }
