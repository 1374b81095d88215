"""Real two-rank PyTorch DDP (gloo, CPU) through `astraeus up` and its local agent, with scripts
as a user writes them (tests/workloads/scripts/): nothing of Astraeus in them but the optional
progress file (issue 20: before, MASTER_ADDR was the machine's name `local`, which does not
resolve, and both ranks timed out in init_process_group).

The three runs are submitted together (a module's fixture), so that one wait for the tick
counts them all:
- a healthy run completes, both ranks' logs hold their steps, its GPU time is productive;
- rank 1 ends at step 5: the run's reason names rank 1's worker, its last_failure holds its last
  lines, rank 0's log holds gloo's error (its peer closed the connection);
- each worker runs `torchrun --nnodes=$WORLD_SIZE --node_rank=$RANK …`: it completes.
Each run's ledger is checked to the second against the worker intervals behind it, and those
against the workers' histories (seed goodput: categories as its table says).
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.e2e.live import Server, running
from tests.workloads.conftest import Workloads

TORCHRUN = (
    "torchrun --nnodes=$WORLD_SIZE --node_rank=$RANK --master_addr=$MASTER_ADDR "
    "--master_port=$MASTER_PORT --nproc_per_node=1 {script} --steps 20 --sleep 0.25"
)
RUNS = ("ddp", "ddp-crash", "ddp-torchrun")
# A worker's state when an interval begins → the categories the seed's table allows then.
CATEGORIES = {
    "Pending": {"waiting"},
    "Starting": {"starting"},
    "Running": {"productive", "idle", "stalled"},
    "Stopping": {"productive", "failure", "stalled", "preemption"},
}


class Api:
    def __init__(self, server: Server, token: str) -> None:
        self.url, self.headers = server.url, {"Authorization": f"Bearer {token}"}

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        answer = httpx.post(
            f"{self.url}/graphql",
            headers=self.headers,
            json={"query": query, "variables": variables},
            timeout=30,
        ).json()
        assert "errors" not in answer, answer
        return dict(answer["data"])

    def get(self, path: str, **params: Any) -> Any:
        return httpx.get(f"{self.url}/v1{path}", params=params, headers=self.headers, timeout=30)

    def submit(self, spec: dict[str, Any]) -> None:
        made = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }", s=spec
        )
        assert made["createRun"]["errors"] == [], made


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, workloads: Workloads) -> Iterator[Api]:
    with running(tmp_path_factory.mktemp("workloads") / "data") as (server, token):
        yield Api(server, token)


def _spec(name: str, workloads: Workloads, command: list[str], **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "workers": 2,
        "gpus": 1,
        "restart_policy": "never",
        # As a user whose machines have a Python environment with torch: on its PATH.
        "environment": {"PATH": workloads.path},
        "command": command,
        **more,
    }


@pytest.fixture(scope="module")
def jobs(api: Api, workloads: Workloads) -> dict[str, dict[str, Any]]:
    script = str(workloads.scripts / "ddp_train.py")
    api.submit(_spec("ddp", workloads, ["python", script, "--steps", "20", "--sleep", "0.25"]))
    api.submit(
        _spec(
            "ddp-crash",
            workloads,
            ["python", script, "--steps", "200", "--sleep", "0.25", "--exit-at", "5"],
        )
    )
    api.submit(_spec("ddp-torchrun", workloads, ["sh", "-c", TORCHRUN.format(script=script)]))
    # The local machine's two cores take one gang at a time (a worker asks for a core), and a
    # rank imports torch in 2 s on an idle core: a minute each when the cores are shared.
    deadline = time.monotonic() + 600
    ended: dict[str, dict[str, Any]] = {}
    while len(ended) < len(RUNS) and time.monotonic() < deadline:
        for name in RUNS:
            job = api.get(f"/jobs/{name}").json()
            if job["status"] in ("Completed", "Failed", "Stopped"):
                ended[name] = job
        time.sleep(1)
    assert len(ended) == len(RUNS), {n: api.get(f"/jobs/{n}").json() for n in RUNS}
    return ended


def log(api: Api, worker: str) -> str:
    answer = api.get(f"/tasks/{worker}/logs", tail=1000)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["logs"])


def test_a_healthy_two_rank_ddp_run_completes_with_both_ranks_logs(
    api: Api, jobs: dict[str, dict[str, Any]]
) -> None:
    job = jobs["ddp"]
    assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed")
    for rank in (0, 1):
        lines = log(api, f"ddp-{rank}").splitlines()
        assert f"rank {rank} of 2: joined at 127.0.0.1:" in "\n".join(lines)
        steps = [line for line in lines if line.startswith(f"rank {rank} step ")]
        assert [s.split()[3] for s in steps] == [str(i) for i in range(20)]
        assert lines[-1] == f"rank {rank}: done"


def test_the_machine_shows_the_address_gangs_reach_it_at(api: Api) -> None:
    # the embedded agent advertises loopback: MASTER_ADDR of every gang placed there
    machines = api.graphql("{ machines { name address } }")["machines"]
    assert machines == [{"name": "local", "address": "127.0.0.1"}]
    spec = api.graphql('{ run(name: "ddp") { workers { name } } }')
    assert spec["run"]["workers"] == [{"name": "ddp-0"}, {"name": "ddp-1"}]


def test_rank_1_ending_names_rank_1_and_rank_0_logs_glooss_error(
    api: Api, jobs: dict[str, dict[str, Any]]
) -> None:
    job = jobs["ddp-crash"]
    assert (job["status"], job["reason"]) == (
        "Failed",
        "Worker ddp-crash-1 failed on local: Exited with code 3; the gang does not run without it",
    )
    failed = api.get("/tasks/ddp-crash-1").json()
    snapshot = failed["last_failure"]
    assert snapshot["exit_code"] == 3
    assert snapshot["log_tail"].splitlines()[-1] == "rank 1: giving up at step 5"
    assert "rank 1 step 4 loss " in snapshot["log_tail"]
    rank0 = log(api, "ddp-crash-0")
    assert "rank 0 step 4 loss " in rank0
    # gloo's own words when its peer is gone (the process ends of it, or is stopped first)
    assert "Connection closed by peer" in rank0 or "Connection reset by peer" in rank0, rank0


def test_torchrun_in_each_worker_completes(api: Api, jobs: dict[str, dict[str, Any]]) -> None:
    job = jobs["ddp-torchrun"]
    assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed")
    for rank in (0, 1):
        text = log(api, f"ddp-torchrun-{rank}")
        assert f"rank {rank} step 19 loss " in text and f"rank {rank}: done" in text, text


# -- the ledger, to the second ----------------------------------------------------------------

INTERVALS = """query($run: String!) {
  goodputIntervals(by: RUN, name: $run, limit: 10000) {
    worker start end category held gpus gpuHours
  }
}"""
HISTORIES = """query($run: String!) {
  run(name: $run) { createdAt workers { name history { transitionAt state } } }
}"""
LEDGER = """query($start: DateTime!) { goodput(by: RUN, start: $start) {
  rows(first: 1000) { name ledger { productiveGpuHours gpuHours { category gpuHours } } }
} }"""


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _counted(api: Api, run: str, ended: dict[str, datetime]) -> list[dict[str, Any]] | None:
    """The run's intervals once every worker's are counted up to its end; None before."""
    intervals = api.graphql(INTERVALS, run=run)["goodputIntervals"]
    last: dict[str, datetime] = {}
    for i in intervals:
        last[i["worker"]] = max(last.get(i["worker"], _at(i["end"])), _at(i["end"]))
    done = all(w in last and last[w] >= at - timedelta(seconds=1) for w, at in ended.items())
    return intervals if done else None


@pytest.fixture(scope="module")
def counted(
    api: Api, jobs: dict[str, dict[str, Any]]
) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each run's workers' histories and its intervals, once the tick counted them to the end
    (the minute after the last one ended, and the tick after that: up to two minutes)."""
    histories = {run: api.graphql(HISTORIES, run=run)["run"] for run in RUNS}
    ends = {
        run: {w["name"]: _at(w["history"][0]["transitionAt"]) for w in h["workers"]}
        for run, h in histories.items()
    }
    deadline = time.monotonic() + 200
    found: dict[str, list[dict[str, Any]]] = {}
    while len(found) < len(RUNS) and time.monotonic() < deadline:
        for run in RUNS:
            if run not in found and (intervals := _counted(api, run, ends[run])) is not None:
                found[run] = intervals
        time.sleep(2)
    assert len(found) == len(RUNS), f"the tick never counted {set(RUNS) - set(found)}"
    return {run: (histories[run], found[run]) for run in RUNS}


@pytest.mark.parametrize("run", RUNS)
def test_the_ledger_is_the_workers_history_to_the_second(
    api: Api, counted: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]], run: str
) -> None:
    history, intervals = counted[run]
    created = _at(history["createdAt"])
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i in intervals:
        by_worker[i["worker"]].append(i)
    for worker in history["workers"]:
        changes = [(_at(h["transitionAt"]), h["state"]) for h in reversed(worker["history"])]
        mine = sorted(by_worker[worker["name"]], key=lambda i: i["start"])
        # Conservation: from submission to its end, every second once (1 GPU each).
        assert abs((_at(mine[0]["start"]) - created).total_seconds()) < 1
        assert abs((_at(mine[-1]["end"]) - changes[-1][0]).total_seconds()) < 1
        for a, b in itertools.pairwise(mine):
            assert a["end"] == b["start"], (a, b)
        # Each interval in the category its worker's state then allows.
        for i in mine:
            start = _at(i["start"])
            state = next(
                (s for at, s in reversed(changes) if at <= start + timedelta(milliseconds=1)),
                "Pending",
            )
            assert i["category"] in CATEGORIES[state], (worker["name"], state, i)
            seconds = (_at(i["end"]) - start).total_seconds()
            assert abs(i["gpuHours"] * 3600 - seconds * i["gpus"]) < 1, i
        # Every change of state inside the worker's span is an interval's edge, to the second.
        edges = [_at(i["start"]) for i in mine] + [_at(mine[-1]["end"])]
        for at, _ in changes[1:]:
            assert min(abs((at - e).total_seconds()) for e in edges) < 1, (worker["name"], at)
    # The ledger's figures are the intervals' sums (seed: every figure can be explained).
    hour = created.replace(minute=0, second=0, microsecond=0)
    rows = api.graphql(LEDGER, start=hour.isoformat())["goodput"]["rows"]
    ledger = next(r["ledger"] for r in rows if r["name"] == run)
    sums: dict[str, float] = defaultdict(float)
    for i in intervals:
        sums[i["category"]] += i["gpuHours"]
    for figure in ledger["gpuHours"]:
        assert abs(figure["gpuHours"] - sums.get(figure["category"], 0.0)) * 3600 < 1, figure
    if run != "ddp-crash":
        # stepping, with the progress file appended to: the simulated GPUs were busy
        assert ledger["productiveGpuHours"] * 3600 > 5, ledger
