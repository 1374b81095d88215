"""What the workload tests share: a user's calls to a live `astraeus up`, its runs' specs, and
the check of a run's ledger to the second against its workers' histories (seed goodput: the
ledger's figures are its intervals' sums, the intervals tile each worker's history, each in a
category its worker's state then allows)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from backend.accounting import counting
from backend.clock import Clock
from backend.db import Database
from tests.e2e.live import Server
from tests.support import FakeClock
from tests.support.http import HTTP

if TYPE_CHECKING:
    from tests.workloads.conftest import Workloads

ENDED = ("Completed", "Failed", "Stopped")
# A gang placed again after a failure, a preemption or a stall waits (and its workers end)
# in the cause's category, held by no one (the seed's table).
_REQUEUED = {"failure", "preemption", "stalled"}
# A worker's state when an interval begins → the categories the seed's table allows then.
CATEGORIES: dict[str, set[str]] = {
    "Pending": {"waiting"},
    "Preparing": {"starting", "restart"},
    "Pulling": {"starting", "restart"},
    "Starting": {"starting", "restart"},
    "Running": {"productive", "idle"},
    "Stopping": {"productive", "idle", "failure", "stalled", "preemption"},
    # an attempt's end whose gang is placed again (a run's end counts nothing after it)
    "Stopped": _REQUEUED,
    "Failed": _REQUEUED,
    "Completed": set(),
}
# Reasons that say more than the state (the lifecycle's sentences: lifecycle/endings.py,
# progress.py, rules.py).
REQUEUED = "Waiting to be placed again: "
STALLED = ("Stalled: ", "Stalled with its gang: ")
# A gang whose rank 0 met its MASTER_PORT held by another program (issue 37 N3): still being
# started while it stops, waiting after (no failure).
PORT_TAKEN = "MASTER_PORT"


def allowed(state: str, reason: str) -> set[str]:
    """The categories a worker's time may be in while it is in ``state`` for ``reason``:
    stalled from the moment it was found stalled (dated back to its last progress) to its
    gang's stop, and never before; torn down with its gang as the gang's cause."""
    if PORT_TAKEN in reason and state in ("Pending", "Stopped"):
        return {"waiting"}
    if PORT_TAKEN in reason and state == "Stopping":
        return {"starting", "restart"}
    if state == "Pending" and reason.startswith(REQUEUED):
        return _REQUEUED
    if state == "Running" and reason.startswith(STALLED):
        return {"stalled"}
    if state == "Stopping" and reason.startswith("Stopping: worker "):
        return {"stalled"} if reason.endswith(" stalled") else {"failure"}
    return CATEGORIES[state]


class Api:
    """A user's calls to a live server, with the first admin token: GraphQL and the REST shim."""

    def __init__(self, server: Server, token: str) -> None:
        self.server = server
        self.url, self.headers = server.url, {"Authorization": f"Bearer {token}"}

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        answer = HTTP.post(
            f"{self.url}/graphql",
            headers=self.headers,
            json={"query": query, "variables": variables},
            timeout=30,
        ).json()
        assert "errors" not in answer, answer
        return dict(answer["data"])

    def get(self, path: str, **params: Any) -> Any:
        return HTTP.get(f"{self.url}/v1{path}", params=params, headers=self.headers, timeout=30)

    def submit(self, spec: dict[str, Any]) -> None:
        made = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }", s=spec
        )
        assert made["createRun"]["errors"] == [], made

    def job(self, run: str) -> dict[str, Any]:
        answer = self.get(f"/jobs/{run}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def log(self, worker: str) -> str:
        answer = self.get(f"/tasks/{worker}/logs", tail=1000)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["logs"])


def spec(name: str, workloads: Workloads, command: list[str], **more: Any) -> dict[str, Any]:
    """Two ranks of one (simulated) GPU each, as a user whose machines have a Python
    environment with torch on its PATH."""
    return {
        "name": name,
        "workers": 2,
        "gpus": 1,
        "restart_policy": "never",
        "environment": {"PATH": workloads.path},
        "command": command,
        **more,
    }


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


INTERVALS = """query($run: String!) {
  goodputIntervals(by: RUN, name: $run, limit: 10000) {
    worker start end category held gpus gpuHours
  }
}"""
HISTORIES = """query($run: String!) {
  run(name: $run) { createdAt workers { name history { transitionAt state reason } } }
}"""
LEDGER = """query($start: DateTime!) { goodput(by: RUN, start: $start) {
  rows(first: 1000) { name ledger { goodput productiveGpuHours gpuHours { category gpuHours } } }
} }"""

History = dict[str, Any]
Intervals = list[dict[str, Any]]


def _counted(api: Api, run: str, ended: dict[str, datetime]) -> Intervals | None:
    """The run's intervals once every worker's are counted up to its end; None before."""
    intervals: Intervals = api.graphql(INTERVALS, run=run)["goodputIntervals"]
    last: dict[str, datetime] = {}
    for i in intervals:
        last[i["worker"]] = max(last.get(i["worker"], at(i["end"])), at(i["end"]))
    done = all(w in last and last[w] >= end - timedelta(seconds=1) for w, end in ended.items())
    return intervals if done else None


async def _tick(url: str, clock: Clock) -> None:
    db = Database.from_url(url)
    try:
        async with db.transaction() as session:
            await counting.tick(session, clock)
    finally:
        await db.dispose()


# The agent sends its samples every 5 s, written in batches: what a worker did is all on the
# server this long after its end.
SAMPLES_IN_S = 10


def tick_after(url: str, latest: datetime) -> None:
    """One tick on the server's database that counts the minute of ``latest`` (the latest end
    of the runs read) whole, as the server's own would once that minute is over: once the
    ended workers' last samples are in, with a clock at that minute's end (or now, if later).
    Every second of an ended worker is on the server by then, so it counts what a tick at the
    minute's end would; the wall clock's wait for that end (30 s on average, up to 60) was no
    part of what is checked (issue 39). A worker still running there is counted to that
    minute's end too, before its last samples come (and again when they do, as late ones):
    read so only where what is checked has ended."""
    while datetime.now(UTC) < latest + timedelta(seconds=SAMPLES_IN_S):
        time.sleep(0.5)
    over = counting.minute_floor(latest) + timedelta(minutes=1)
    asyncio.run(_tick(url, FakeClock(max(over, datetime.now(UTC)))))


def counted(
    api: Api, runs: Iterable[str], seconds: float = 200
) -> dict[str, tuple[History, Intervals]]:
    """Each ended run's workers' histories and its intervals, counted to the end: one tick
    runs from here on the server's own database (`tick_after`; the server's comes every
    minute from its start: up to a minute later)."""
    runs = list(runs)
    histories = {run: api.graphql(HISTORIES, run=run)["run"] for run in runs}
    ends = {
        run: {w["name"]: at(w["history"][0]["transitionAt"]) for w in h["workers"]}
        for run, h in histories.items()
    }
    latest = max(end for worker_ends in ends.values() for end in worker_ends.values())
    tick_after(f"sqlite:///{api.server.data_dir / 'astraeus.db'}", latest)
    deadline = time.monotonic() + seconds
    found: dict[str, Intervals] = {}
    while len(found) < len(runs) and time.monotonic() < deadline:
        for run in runs:
            if run not in found and (intervals := _counted(api, run, ends[run])) is not None:
                found[run] = intervals
        if len(found) < len(runs):
            time.sleep(2)
    assert len(found) == len(runs), f"the tick never counted {set(runs) - set(found)}"
    return {run: (histories[run], found[run]) for run in runs}


def ledger_of(api: Api, run: str, created: datetime) -> dict[str, Any]:
    hour = created.replace(minute=0, second=0, microsecond=0)
    rows = api.graphql(LEDGER, start=hour.isoformat())["goodput"]["rows"]
    return dict(next(r["ledger"] for r in rows if r["name"] == run))


def by_worker(intervals: Intervals) -> dict[str, Intervals]:
    out: dict[str, Intervals] = defaultdict(list)
    for i in intervals:
        out[i["worker"]].append(i)
    return {w: sorted(mine, key=lambda i: i["start"]) for w, mine in out.items()}


def check_ledger(api: Api, run: str, history: History, intervals: Intervals) -> dict[str, Any]:
    """The run's ledger to the second against its workers' histories; the ledger."""
    created = at(history["createdAt"])
    mine_by_worker = by_worker(intervals)
    for worker in history["workers"]:
        name = worker["name"]
        changes = [
            (at(h["transitionAt"]), h["state"], h["reason"]) for h in reversed(worker["history"])
        ]
        mine = mine_by_worker[name]
        # Conservation: from submission to its end, every second once (1 GPU each).
        assert abs((at(mine[0]["start"]) - created).total_seconds()) < 1
        assert abs((at(mine[-1]["end"]) - changes[-1][0]).total_seconds()) < 1
        for a, b in itertools.pairwise(mine):
            assert a["end"] == b["start"], (a, b)
        # Each interval in a category every state of its worker during it allows (the state
        # at its start to the millisecond, and those it changed to before its end).
        for i in mine:
            start, end = at(i["start"]), at(i["end"])
            before = [c for c in changes if c[0] <= start + timedelta(milliseconds=1)]
            states = [before[-1][1:] if before else ("Pending", "")]
            states += [(s, r) for moment, s, r in changes if start < moment < end]
            for state, reason in states:
                assert i["category"] in allowed(state, reason), (name, state, reason, i)
            seconds = (end - start).total_seconds()
            assert abs(i["gpuHours"] * 3600 - seconds * i["gpus"]) < 1, i
        # Every change of state that changes what its time may be counted as, inside the
        # worker's span, is an interval's edge, to the second (a stalled worker stopping
        # stays stalled: one interval).
        edges = [at(i["start"]) for i in mine] + [at(mine[-1]["end"])]
        for (_, s0, r0), (moment, s1, r1) in itertools.pairwise(changes):
            if allowed(s0, r0) & allowed(s1, r1):
                continue
            assert min(abs((moment - e).total_seconds()) for e in edges) < 1, (name, moment)
    # The ledger's figures are the intervals' sums (seed: every figure can be explained).
    ledger = ledger_of(api, run, created)
    sums: dict[str, float] = defaultdict(float)
    for i in intervals:
        sums[i["category"]] += i["gpuHours"]
    for figure in ledger["gpuHours"]:
        assert abs(figure["gpuHours"] - sums.get(figure["category"], 0.0)) * 3600 < 1, figure
    return ledger


def wait_ended(api: Api, runs: Iterable[str], seconds: float) -> dict[str, dict[str, Any]]:
    """Each run's job once it has ended (Completed, Failed or Stopped)."""
    runs = list(runs)
    deadline = time.monotonic() + seconds
    ended: dict[str, dict[str, Any]] = {}
    while len(ended) < len(runs) and time.monotonic() < deadline:
        for run in runs:
            if run not in ended and (job := api.job(run))["status"] in ENDED:
                ended[run] = job
        time.sleep(1)
    assert len(ended) == len(runs), {r: api.job(r) for r in runs}
    return ended
