"""What a workload reaches on the network (issue 37 N4, N3), live on `astraeus up` with its
local agent as root, real processes and real PyTorch DDP (gloo):

- a workload cannot connect to PostgreSQL, Redis or the server's own port on loopback (nor on
  the machine's other addresses), while a user of the machine that runs no workload still can;
- a workload of another workspace cannot connect to a live gang's MASTER_PORT (its TCPStore),
  which the gang's own ranks reach;
- a workload of workspace B squats every port of the MASTER_PORT range it can bind; a two-rank
  DDP run of workspace A and one of B both complete, their rank 0 refused its first port and
  placed again on one its agent held: nothing charged to either as a failure, no restart burnt,
  every ledger to the second against its workers' histories.

Each fails on the code before issue 37: the probes connect, the victim fails ("MASTER_PORT … is
in use on local by another program") and is charged failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent import network
from tests.support.hostile_workloads import SQUAT
from tests.support.sandboxed import connects_as
from tests.workloads.conftest import Workloads
from tests.workloads.ledger import Api, check_ledger, counted, spec, wait_ended

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="workloads run as the agent's own user"),
    pytest.mark.skipif(
        shutil.which("nft") is None, reason="nftables is not installed (apt-get install nftables)"
    ),
]

PYTHON = "/usr/bin/python3"
# Connects to each HOST:PORT given and says what happened.
PROBE = """
import socket, sys
for target in sys.argv[1:]:
    host, _, port = target.rpartition(':')
    host = host.strip('[]')
    s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
    s.settimeout(5)
    try:
        s.connect((host, int(port)))
        said = 'connected'
    except ConnectionRefusedError:
        said = 'refused'
    except OSError as error:
        said = f'error {error}'
    finally:
        s.close()
    print(target, said, flush=True)
print('probed', flush=True)
"""
# Connects to every port of FIRST..LAST on 127.0.0.1, saying which it reached.
SCAN = """
import socket, sys
first, last = int(sys.argv[1]), int(sys.argv[2])
reached = []
for port in range(first, last + 1):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(('127.0.0.1', port))
        reached.append(port)
    except OSError:
        pass
    finally:
        s.close()
print('reached', *reached, flush=True)
"""


def one(name: str, command: list[str]) -> dict[str, Any]:
    return {"name": name, "workers": 1, "gpus": 1, "restart_policy": "never", "command": command}


def wait_for_line(api: Api, worker: str, words: str, seconds: float = 180) -> str:
    deadline = time.monotonic() + seconds
    text = ""
    while time.monotonic() < deadline:
        answer = api.get(f"/tasks/{worker}/logs", tail=1000)  # 404 until it is placed
        text = str(answer.json().get("logs") or "") if answer.status_code == 200 else ""
        if words in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"{worker} never said {words!r}: {text!r}")


def reachable(port: int, uid: int) -> bool:
    """Whether a user of the machine that runs no workload (``uid``) reaches 127.0.0.1:port."""
    return connects_as(uid, port)


def master_range(api: Api) -> tuple[int, int]:
    first, _, last = api.server.env["ASTRAEUS_MASTER_PORTS"].partition("-")
    return int(first), int(last)


@pytest.fixture(scope="module")
def team_b(api: Api) -> Api:
    """A user of a second workspace of the same server."""
    api.server.cli("workspace", "create", "team-b")
    token = api.server.cli("token", "create", "--workspace", "team-b", "--user", "bob").strip()
    return Api(api.server, token)


def test_a_workload_cannot_reach_the_control_planes_services(api: Api) -> None:
    # issue 37 N4: PostgreSQL (its superuser, through trust authentication), Redis, the
    # server's own port, on loopback and on the machine's other addresses
    services = {"PostgreSQL": 5432, "Redis": 6379}
    for name, port in services.items():
        if not reachable(port, 65534):
            pytest.skip(f"{name} does not listen on 127.0.0.1:{port} here")
    server_port = int(api.server.url.rpartition(":")[2])
    address = network.as_address(socket.gethostname()) or "127.0.0.1"
    targets = [
        "127.0.0.1:5432",
        "127.0.0.1:6379",
        "[::1]:6379",
        f"127.0.0.1:{server_port}",
        f"{address}:5432",
    ]
    api.submit(one("probe-services", [PYTHON, "-c", PROBE, *targets]))
    assert wait_ended(api, ["probe-services"], 180)["probe-services"]["status"] == "Completed"
    said = dict(line.rsplit(" ", 1) for line in api.log("probe-services-0").splitlines()[:-1])
    assert said == {target: "refused" for target in targets}, said
    # the rules touch workloads' packets only: a user that runs none still connects
    assert reachable(5432, 65534) and reachable(6379, 65534)


@pytest.fixture(scope="module")
def long_gang(api: Api, workloads: Workloads) -> Iterator[int]:
    """A two-rank DDP run of the first workspace, running: its MASTER_PORT."""
    script = str(workloads.scripts / "ddp_train.py")
    api.submit(spec("ddp-long", workloads, ["python", script, "--steps", "160", "--sleep", "0.25"]))
    text = wait_for_line(api, "ddp-long-0", "rank 0 step 3 ")
    port = int(text.split("rank 0 of 2: joined at 127.0.0.1:", 1)[1].split()[0])
    yield port


def test_another_workspace_cannot_reach_a_live_gangs_master_port(
    api: Api, team_b: Api, long_gang: int
) -> None:
    # issue 37 N4: a workload of workspace B scans the MASTER_PORT range while A's gang runs
    first, last = master_range(api)
    assert first <= long_gang <= last
    assert network.listeners().get(long_gang), "its rank 0 listens there"
    team_b.submit(one("scan", [PYTHON, "-c", SCAN, str(first), str(last)]))
    assert wait_ended(team_b, ["scan"], 180)["scan"]["status"] == "Completed"
    assert team_b.log("scan-0").splitlines()[-1] == "reached", team_b.log("scan-0")
    # its own ranks reach it: the gang trains on to its end
    job = wait_ended(api, ["ddp-long"], 400)["ddp-long"]
    assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed")


RUNS = ("victim", "squatters-own")


@pytest.fixture(scope="module")
def squatted(api: Api, team_b: Api, workloads: Workloads) -> dict[str, dict[str, Any]]:
    """B's workload holds every port of the range it can; then A's and B's DDP runs."""
    first, last = master_range(api)
    team_b.submit(one("squat", [PYTHON, "-c", SQUAT, str(first), str(last), "600"]))
    held = wait_for_line(team_b, "squat-0", "holding ")
    assert int(held.split("holding ", 1)[1].split()[0]) >= (last - first + 1) * 9 // 10
    script = str(workloads.scripts / "ddp_train.py")
    command = ["python", script, "--steps", "20", "--sleep", "0.25"]
    api.submit(spec("victim", workloads, command))
    team_b.submit(spec("squatters-own", workloads, command))
    ended = wait_ended(api, ["victim"], 600) | wait_ended(team_b, ["squatters-own"], 600)
    team_b.graphql('mutation { stopRun(name: "squat") { errors { message } } }')
    return ended


def test_a_squatted_master_port_range_fails_no_run(
    api: Api, team_b: Api, squatted: dict[str, dict[str, Any]]
) -> None:
    # issue 37 N3 and the acceptance: both Complete, no restart burnt, nothing failed
    first, last = master_range(api)
    for caller, run in ((api, "victim"), (team_b, "squatters-own")):
        job = squatted[run]
        assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed"), job
        found = caller.graphql(
            "query($n: String!) { run(name: $n) { workers { name restarts "
            "history { state reason } } } }",
            n=run,
        )["run"]["workers"]
        assert [w["restarts"] for w in found] == [0, 0]
        reasons = [h["reason"] for w in found for h in w["history"]]
        assert any(r.startswith("MASTER_PORT ") for r in reasons), reasons  # it met the squat
        assert not [h for w in found for h in w["history"] if h["state"] == "Failed"]
        text = caller.log(f"{run}-0")
        port = int(text.split("rank 0 of 2: joined at 127.0.0.1:", 1)[1].split()[0])
        assert not first <= port <= last  # the port its agent held for it


@pytest.fixture(scope="module")
def squat_ledgers(api: Api, team_b: Api, squatted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return counted(api, ["victim"]) | counted(team_b, ["squatters-own"])


@pytest.mark.parametrize("run", RUNS)
def test_nothing_of_the_squat_is_charged_as_failure(
    api: Api, team_b: Api, squat_ledgers: dict[str, Any], run: str
) -> None:
    caller = api if run == "victim" else team_b
    history, intervals = squat_ledgers[run]
    ledger = check_ledger(caller, run, history, intervals)
    failure = [g for g in ledger["gpuHours"] if g["category"] == "failure"]
    assert all(g["gpuHours"] == 0 for g in failure), ledger
    assert not [i for i in intervals if i["category"] == "failure"], intervals


def test_the_agent_keeps_its_rules_in_a_table_of_its_own(api: Api) -> None:
    install = hashlib.sha256(str((api.server.data_dir / "agent").resolve()).encode())
    table = network.table_name(install.hexdigest()[:12])
    rules = subprocess.run(
        ["nft", "list", "table", "inet", table], capture_output=True, text=True, check=True
    ).stdout
    # every rule of its output chain matches its workloads' user ids alone
    uids = api.server.env.get("ASTRAEUS_AGENT_WORKLOAD_UIDS", "2000000-2065535")
    rejects = [line for line in rules.splitlines() if "reject" in line and "iif" not in line]
    assert rejects and all(f"meta skuid {uids} " in line for line in rejects), rules
