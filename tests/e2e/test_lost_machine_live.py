"""A machine killed -9 is charged failure from its last contact (issue 36; seed G-10, L-21, L-55,
L-68), live: `astraeus up` and a separately started `astraeus agent` on loopback, a gang of two
ranks on it, the agent killed -9 while they run. Both ranks fail at the machine's last contact
(its last message the server read, which the test saw written before the kill), each with its
failure snapshot: the lines the server had relayed of rank 1 (a tail read while it ran), none
of rank 0 (nothing of it ever reached the server). The restarts agree in GraphQL and REST while
the run waits for its restart. Its ledger, counted by the server, equals an oracle computed
here from the workers' histories and the seed's table, to the second: failure, held, from the
last contact to the loss's discovery, and failure, not held, from then to its owner's stop."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support import WORKLOAD_PYTHON
from tests.support.processes import Cluster
from tests.workloads.ledger import Api, at, check_ledger, counted

LOST = "Machine lost: its lease expired"
LEASE = timedelta(seconds=8)  # its cluster's machines' lease
PRINTS = (
    "import itertools, os, time\n"
    "for i in itertools.count():\n"
    "    print(f\"rank {os.environ['RANK']} step {i}\", flush=True)\n"
    "    time.sleep(0.5)\n"
)
STATE = """query($n: String!) { run(name: $n) { state reason restartLoop { restarts }
  workers { name state restarts lastFailure } } }"""
HISTORIES = """query($n: String!) { run(name: $n) {
  workers { name gpus history { transitionAt state reason } } } }"""
# What the seed's table makes of a worker's time in each state (the oracle's own reading):
# "starting" while placed and not yet running, productive or idle while running, and failure
# once its machine is lost: held until the loss is found (it still holds its GPUs), not held
# while it waits to be placed again.
RUNNING = "running"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, lease="8s")
    try:
        yield c
    finally:
        c.close()


def last_seen(cluster: Cluster) -> datetime | None:
    machines = cluster.graphql("{ machines { name lastSeenAt } }")["machines"]
    seen = next(m["lastSeenAt"] for m in machines if m["name"] == "gpu-a")
    return at(seen) if seen else None


def oracle(
    history: list[dict[str, Any]], gpus: int, until: datetime
) -> dict[tuple[str, bool], float]:
    """GPU-seconds by (category, held) of one worker, from its history (oldest first)."""
    out: dict[tuple[str, bool], float] = defaultdict(float)
    changes = [(at(h["transitionAt"]), h["state"], h["reason"]) for h in history]
    for (start, state, reason), (end, _, _) in zip(
        changes, [*changes[1:], (until, "", "")], strict=True
    ):
        if state == "Pending":
            key = (
                ("failure", False)
                if reason.startswith("Waiting to be placed again")
                else (
                    "waiting",
                    False,
                )
            )
        elif state == "Starting":
            key = ("starting", True)
        elif state == "Running":
            key = (RUNNING, True)
        elif state == "Stopping" and reason.startswith("Stopping: worker "):
            key = ("failure", True)  # torn down with its gang after the failure
        elif state == "Failed" and reason == LOST:
            key = ("failure", True)  # lost, still holding its GPUs, until the loss is found
        elif state == "Stopped":
            continue  # its run ended: nothing more is counted
        else:
            raise AssertionError(f"the oracle has no category for {state}: {reason}")
        out[key] += (end - start).total_seconds() * gpus
    return out


def test_a_machine_killed_is_charged_failure_from_its_last_contact(cluster: Cluster) -> None:
    agent = cluster.agent("gpu-a")
    agent.start()
    cluster.wait(
        "gpu-a joined",
        lambda: (
            [m["state"] for m in cluster.graphql("{ machines { state } }")["machines"]] == ["ready"]
        ),
    )
    cluster.submit(name="lost", workers=2, gpus=1, command=[WORKLOAD_PYTHON, "-c", PRINTS])
    cluster.wait("both running", lambda: cluster.status("lost") == "Running")
    cluster.wait(
        "rank 1's lines", lambda: len(cluster.get("/tasks/lost-1/logs?tail=50")["logs"]) > 40
    )
    seen = cluster.get("/tasks/lost-1/logs?tail=50")["logs"]  # relayed by the server

    # The server has written a contact of gpu-a's since `heard`; then the agent is killed.
    heard = datetime.now(UTC)
    cluster.wait("a contact written", lambda: (last_seen(cluster) or heard) > heard)
    agent.kill()
    killed = datetime.now(UTC)
    cluster.wait(
        "the machine lost",
        lambda: cluster.get("/jobs/lost")["reason"].startswith("Restarting in"),
        seconds=60,
    )
    silent = last_seen(cluster)  # its last message read (one sent before the kill, at most)
    assert silent is not None and heard < silent, (heard, silent, killed)

    # Every rank failed at the last contact, with its snapshot; rank 1's lines as relayed.
    run = cluster.graphql(STATE, n="lost")["run"]
    assert run["state"] == "Pending"
    assert run["reason"] == (
        f"Restarting in 10s (1/10): Worker lost-0 failed on gpu-a: {LOST}; the gang does not "
        "run without it"
    )
    snapshots = {w["name"]: w["lastFailure"] for w in run["workers"]}
    for name, tail in (("lost-0", ""), ("lost-1", seen)):
        snapshot = snapshots[name]
        assert (snapshot["reason"], snapshot["exit_code"], snapshot["log_tail"]) == (
            LOST,
            None,
            tail,
        ), name
        assert at(snapshot["failed_at"]) == silent, (name, snapshot, silent)
    assert seen.splitlines()[-1].startswith("rank 1 step ")

    # The restarts agree: GraphQL's panel and workers, REST's job and tasks.
    tasks = cluster.get("/tasks?job=lost")["tasks"]
    job = cluster.get("/jobs/lost")
    assert run["restartLoop"] == {"restarts": 1}
    assert job["restart_loop"]["restarts"] == 1
    assert [w["restarts"] for w in run["workers"]] == [1, 1]
    assert [t["restarts"] for t in tasks] == [1, 1]

    # No machine to restart on: its owner stops it; its ledger is then final.
    stopped = cluster.graphql('mutation { stopRun(name: "lost") { errors { message } } }')
    assert stopped["stopRun"]["errors"] == []
    cluster.wait("stopped", lambda: cluster.status("lost") == "Stopped")
    api = Api(cluster.server, cluster.token)
    (history, intervals) = counted(api, ["lost"])["lost"]
    check_ledger(api, "lost", history, intervals)  # the ledger's figures are its intervals'

    workers = cluster.graphql(HISTORIES, n="lost")["run"]["workers"]
    expected: dict[tuple[str, bool], float] = defaultdict(float)
    for worker in workers:
        changes = list(reversed(worker["history"]))
        lost_at = [at(h["transitionAt"]) for h in changes if h["reason"] == LOST]
        assert lost_at[0] == silent, (worker["name"], lost_at)
        end = at(changes[-1]["transitionAt"])
        for key, seconds in oracle(changes, worker["gpus"], end).items():
            expected[key] += seconds
    found: dict[tuple[str, bool], float] = defaultdict(float)
    for i in intervals:
        category = RUNNING if i["category"] in ("productive", "idle") else i["category"]
        found[(category, i["held"])] += (at(i["end"]) - at(i["start"])).total_seconds() * i["gpus"]
    assert {k: round(v, 3) for k, v in found.items()} == {
        k: round(v, 3) for k, v in expected.items()
    }
    # Failure, held, from the last contact to the loss's discovery (a lease at least after
    # it): both ranks, a GPU each; nothing running after the last contact.
    lost_for = loss_found(cluster) - silent
    assert lost_for >= LEASE, lost_for
    assert round(found[("failure", True)], 3) == round(2 * lost_for.total_seconds(), 3)


def loss_found(cluster: Cluster) -> datetime:
    """When the server found the machine lost: the run's restart, decided then."""
    history = cluster.get("/jobs/lost")["history"]
    return at(next(h["transition_at"] for h in history if h["reason"].startswith("Restarting")))
