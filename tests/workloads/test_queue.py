"""The queue on a live `astraeus up` with real PyTorch DDP (issue 36), each run's ledger checked
to the second against its workers' histories (the oracle: tests/workloads/ledger.py).

One server: its local agent has 2 (simulated) GPUs in pool "local"; a second agent joins in
pool "far" and is killed, so that "far" has no live machine. Then, in this order:
- `pinned` asks for pool "far": "No machine fits: pool far of local has no ready machine", and
  it delays nobody (before: every later run of no pool was "Queued behind pinned" and did not
  start though the local machine was free: `restarts` never started);
- `restarts`, a two-rank DDP run of both GPUs (no pool): rank 1 crashes at step 6 of its first
  attempt, after the checkpoint of step 3; it waits 10 s ("Restarting in 10s (1/2): …"),
  resumes from its checkpoint and completes;
- `same` (its priority) and `lower` (a lower one), each asking for both GPUs: neither takes
  them in the restart wait of `restarts` (before: `same` was placed in the wait and completed
  before `restarts` was placed again); `same` runs once `restarts` has ended, then `lower`.
The restart wait of `restarts` is failure, held by no one (the seed's table: failure is held
while placed; "waiting to be placed again after a failure" is not placed), to the second.
The reasons `same` gives meanwhile ("Queued behind restarts") are read in
tests/scheduling/test_queue.py, on a clock of the test's own.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.live import AgentProcess, running
from tests.support.waiting import wait_for
from tests.workloads.conftest import Workloads
from tests.workloads.ledger import (
    Api,
    History,
    Intervals,
    at,
    by_worker,
    check_ledger,
    counted,
    spec,
    wait_ended,
)

LEASE_S = 16  # over the local agent's heartbeat (10 s): only the killed agent is lost
RUNS = ("pinned", "restarts", "same", "lower")
PINNED = "No machine fits: pool far of local has no ready machine"
QUICK = ["python", "-c", "import time; time.sleep(2); print('done', flush=True)"]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, workloads: Workloads) -> Iterator[Api]:
    data = tmp_path_factory.mktemp("queue") / "data"
    settings = {"lease_time": f"{LEASE_S}s", "scheduler_interval": "1s", "local_agent_gpus": "2"}
    with running(data, **settings) as (server, token):
        yield Api(server, token)


def machines(api: Api) -> dict[str, tuple[str | None, str]]:
    found = api.graphql("{ machines { name pool state } }")["machines"]
    return {m["name"]: (m["pool"], m["state"]) for m in found}


def a_pool_with_no_live_machine(api: Api) -> None:
    """Pool "far": its one machine joined, then its agent was killed and its lease expired."""
    folder = api.server.data_dir.parent / "far"
    folder.mkdir()
    far = AgentProcess(api.server, "far-0", folder / "agent", gpus=2, extra=["--pool", "far"])
    far.start()
    try:
        wait_for("far-0 ready", lambda: machines(api).get("far-0") == ("far", "ready"), 60)
    finally:
        far.end()
    wait_for("far-0 lost", lambda: machines(api).get("far-0") == ("far", "lost"), LEASE_S + 30)
    assert machines(api)["local"] == ("local", "ready")


@pytest.fixture(scope="module")
def shared_folder() -> Iterator[Path]:
    """Where `restarts` keeps its checkpoint between attempts (every workload user may write)."""
    folder = Path(tempfile.mkdtemp(prefix="astraeus-queue-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def reason(api: Api, run: str) -> tuple[str, str]:
    job = api.job(run)
    return job["status"], job["reason"]


@pytest.fixture(scope="module")
def seen(api: Api, workloads: Workloads, shared_folder: Path) -> dict[str, Any]:
    """The four runs through to their ends, and `pinned`'s reason meanwhile. Everything else
    the tests read is durable (histories, ledgers): a reason read while a 10 s wait lasts would
    be a read against the clock."""
    a_pool_with_no_live_machine(api)
    api.submit(spec("pinned", workloads, QUICK, workers=1, cpu=0.25, pool="far"))
    wait_for("pinned's reason", lambda: reason(api, "pinned") == ("Pending", PINNED), 60)
    script = str(workloads.scripts / "ddp_train.py")
    train = ["--steps", "12", "--sleep", "0.25", "--fail-at", "6", "--checkpoint-every", "4"]
    command = ["python", script, *train, "--checkpoint", str(shared_folder / "state.pt")]
    api.submit(
        spec("restarts", workloads, command, cpu=0.5, restart_policy="on_failure", max_restarts=2)
    )
    for name, priority in (("same", 50), ("lower", 10)):
        api.submit(spec(name, workloads, QUICK, cpu=0.25, priority=priority))
    jobs = wait_ended(api, RUNS[1:], 600)
    pinned = reason(api, "pinned")
    made = api.graphql('mutation { stopRun(name: "pinned") { errors { message } } }')
    assert made["stopRun"]["errors"] == [], made
    jobs |= wait_ended(api, ["pinned"], 60)
    return {"jobs": jobs, "pinned": pinned, "ledgers": counted(api, RUNS)}


def run_history(job: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["state"], h["reason"]) for h in job["history"]]


def placed_at(job: dict[str, Any]) -> list[datetime]:
    """When each attempt of the run was placed (its Starting rows), oldest first."""
    return [at(h["transition_at"]) for h in job["history"] if h["state"] == "Starting"]


def test_a_run_pinned_to_an_empty_pool_delays_no_run_of_another(seen: dict[str, Any]) -> None:
    jobs = seen["jobs"]
    # still waiting for its pool once the three runs submitted after it had ended
    assert seen["pinned"] == ("Pending", PINNED)
    assert run_history(jobs["pinned"]) == [
        ("Pending", "Run created"),
        ("Stopped", "Stopped by admin"),
    ]
    for run in ("restarts", "same", "lower"):
        assert jobs[run]["status"] == "Completed", jobs[run]


def test_a_run_in_its_restart_wait_is_not_overtaken(seen: dict[str, Any]) -> None:
    jobs = seen["jobs"]
    waits = [
        sentence
        for state, sentence in run_history(jobs["restarts"])
        if state == "Pending" and sentence.startswith("Restarting in")
    ]
    assert waits == [
        "Restarting in 10s (1/2): Worker restarts-1 failed on local: Exited with code 4; the "
        "gang does not run without it"
    ]
    first, again = placed_at(jobs["restarts"])
    ended = at(jobs["restarts"]["ended_at"])
    # `same` and `lower` were placed only once `restarts` had ended, `same` first (before,
    # `same` was placed in the restart wait and `restarts` waited for it to end)
    (same,) = placed_at(jobs["same"])
    (lower,) = placed_at(jobs["lower"])
    assert first < again < ended <= same < lower


def test_every_ledger_is_its_history_to_the_second(seen: dict[str, Any], api: Api) -> None:
    for run, (history, intervals) in seen["ledgers"].items():
        check_ledger(api, run, history, intervals)


def test_the_restart_wait_is_failure_held_by_no_one(seen: dict[str, Any]) -> None:
    # DESIGN §4, seed goodput: failure is "held while placed"; the wait to be placed again
    # after a failure is failure, not held, from the requeue to the next placement
    history: History
    intervals: Intervals
    history, intervals = seen["ledgers"]["restarts"]
    for worker in history["workers"]:
        changes = list(reversed(worker["history"]))
        requeued = next(
            at(h["transitionAt"])
            for h in changes
            if h["state"] == "Pending" and h["reason"].startswith("Waiting to be placed again")
        )
        placed = next(
            at(h["transitionAt"])
            for h in changes
            if at(h["transitionAt"]) > requeued and h["state"] != "Pending"
        )
        mine = by_worker(intervals)[worker["name"]]
        # (from the worker's own end, before its gang was requeued: the same category)
        waiting = [i for i in mine if at(i["start"]) < placed and at(i["end"]) > requeued]
        assert {(i["category"], i["held"]) for i in waiting} == {("failure", False)}
        assert at(waiting[0]["start"]) <= requeued
        assert abs((at(waiting[-1]["end"]) - placed).total_seconds()) < 1
