"""A real two-rank PyTorch DDP run (gloo, CPU) that hangs, and progress written the two usual
ways, through `astraeus up` and its local agent (issue 20), with tests/workloads/scripts/
ddp_train.py as a user writes it.

Four runs go together (a module's fixture), so that one wait for the tick counts them all. The
progress runs go first; the hanging ones once both progress runs step, the machine past the
suite's start. No output is no progress, and a rank is silent while it imports PyTorch (3 s of
CPU here) and while it builds its DDP model (3 s more: DDP imports torch._dynamo), at a
quarter of a core each (the CPU they ask for, which the agent's control group holds them to)
and less under the suite's load: in CI a rank took 66 s to import and 52 s to build its model,
and in a slower CI still, 90 s after joining it had not logged a step, so a stall timeout of a
fixed 1m30s found it stalled before it hung. The hanging runs' stall timeout is therefore
measured, not fixed: one and a half times the longest a progress rank took from running to its
first step on this machine under this load (its longest silent stretch, the import or the
model, is about half of that), and at least 1m30s (`stall_timeout()`).
- `hang-keep`, `hang-restart`: rank 1 hangs after step 5's update, before it logs it (a
  deadlock); rank 0 logs step 5 and blocks in step 6's all-reduce, a step (2 s) later. With
  that stall timeout, both ranks are counted stalled, each from its own last progress (before,
  with `on_stall: restart` only the first was: the gang's stop came before the second was
  looked at; and a stall was dated when the agent noticed the last output). `keep` leaves them
  running (stalled) until their owner stops them; `restart` stops the gang, keeps each
  worker's last lines (before: `last_failure: null`), waits 10 s, and runs it again: it hangs
  again and its retry budget (one restart) is spent;
- `progress-append`, `progress-overwrite`: the same healthy run, one appending its step to
  $ASTRAEUS_PROGRESS_FILE, one writing the file anew each step: the same goodput (before:
  0.157 and 0.996, an appended file was read as no report at all).
Each run's ledger is checked to the second against its workers' histories (ledger.py).
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from backend.config import format_duration
from tests.workloads.conftest import Workloads
from tests.workloads.ledger import (
    ENDED,
    STALLED,
    Api,
    History,
    Intervals,
    at,
    by_worker,
    check_ledger,
    counted,
    spec,
)

HANG_AT = 5  # rank 1 hangs after this step's update; rank 0 logs it and blocks in the next
SLEEP_S = 2.0  # between steps: rank 0's last progress is a step after rank 1's
# The hanging runs' stall timeout: STARTS times the longest start the progress runs took, and
# at least LEAST_STALL_S (see above). In CI twice made the module 18 minutes long.
STARTS = 1.5
LEAST_STALL_S = 90
BACKOFF_S = 10  # the first restart's wait (lifecycle/sentences.py: restart_backoff)
STEPS, STEP_SLEEP_S = 120, 0.5  # the progress runs: a minute of steps
HANGS = ("hang-keep", "hang-restart")
PROGRESS = ("progress-append", "progress-overwrite")
RUNS = HANGS + PROGRESS
# Four gangs of two ranks on the local machine's two cores and eight simulated GPUs at once.
CPU = 0.25
STEP_LINE = re.compile(r"^rank (\d+) step (\d+) loss \S+ at (\d+\.\d+)$", re.MULTILINE)
# How often the runs are looked at: five requests a look, which cost the server 0.09 of a core
# every half second (issue 39, measured on a live `up`); what a look finds has seconds to be
# found in (a restart's wait of BACKOFF_S is the shortest), and stalls, stops and ends are
# dated by the server, not by when they were seen.
LOOK_EVERY_S = 1.0

RUN = """query($run: String!) { run(name: $run) {
  state reason advice { kind reason }
  restartLoop { restarts maxRestarts restartAt worker { name lastFailure } }
  workers { name state lastFailure history { transitionAt state reason } }
} }"""


def last_step(text: str, rank: int, context: object = None) -> tuple[int, datetime]:
    """The last step a rank logged, and when it logged it (its progress is written next); a
    rank that logged none fails with ``context`` (its history: when it ran, stalled, stopped)."""
    found = [m for m in STEP_LINE.finditer(text) if int(m.group(1)) == rank]
    assert found, (text, context)
    step, logged = int(found[-1].group(2)), float(found[-1].group(3))
    return step, datetime.fromtimestamp(logged, UTC)


def stalled(seen: dict[str, Any]) -> str:
    """A hanging worker's reason once stalled (lifecycle/progress.py's sentence)."""
    return f"Stalled: no progress for {seen['stall_timeout']}"


def stalls(worker: dict[str, Any]) -> list[tuple[datetime, str]]:
    """A worker's changes to stalled (oldest first): when, and why."""
    return [
        (at(h["transitionAt"]), h["reason"])
        for h in reversed(worker["history"])
        if h["state"] == "Running" and h["reason"].startswith(STALLED)
    ]


def stalled_spans(intervals: Intervals) -> list[tuple[datetime, datetime]]:
    """The worker's stretches of stalled time (its intervals' runs of that category)."""
    spans: list[tuple[datetime, datetime]] = []
    for i in intervals:
        if i["category"] != "stalled":
            continue
        start, end = at(i["start"]), at(i["end"])
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


def close(a: datetime, b: datetime, seconds: float = 0.001) -> bool:
    return abs((a - b).total_seconds()) <= seconds


def same_spans(
    found: list[tuple[datetime, datetime]], expected: list[tuple[datetime, datetime]]
) -> bool:
    """The same stretches, to the millisecond."""
    return len(found) == len(expected) and all(
        close(a, c) and close(b, d) for (a, b), (c, d) in zip(found, expected, strict=True)
    )


def stepping(api: Api) -> bool:
    """Both progress runs' ranks have logged a step (or the runs have ended)."""
    for run in PROGRESS:
        status = api.job(run)["status"]
        if status in ENDED:
            continue
        if status != "Running":  # no log to read before its workers start
            return False
        for rank in (0, 1):
            if not any(
                int(m.group(1)) == rank for m in STEP_LINE.finditer(api.log(f"{run}-{rank}"))
            ):
                return False
    return True


def stall_timeout(api: Api) -> str:
    """The hanging runs' stall timeout, as the server writes durations: STARTS times the
    longest a progress rank took from running to its first step here and now (its import,
    joining, its model: the longest silent stretch of a start is part of it), and at least
    LEAST_STALL_S."""
    longest = 0.0
    for run in PROGRESS:
        for worker in api.graphql(RUN, run=run)["run"]["workers"]:
            rank = int(worker["name"].rsplit("-", 1)[1])
            running = min(
                at(h["transitionAt"]) for h in worker["history"] if h["state"] == "Running"
            )
            first = next(
                m for m in STEP_LINE.finditer(api.log(worker["name"])) if int(m.group(1)) == rank
            )
            started = datetime.fromtimestamp(float(first.group(3)), UTC) - running
            longest = max(longest, started.total_seconds())
    return format_duration(timedelta(seconds=max(LEAST_STALL_S, math.ceil(STARTS * longest))))


@pytest.fixture(scope="module")
def seen(api: Api, workloads: Workloads) -> dict[str, Any]:
    """The runs submitted, watched to their ends: what the restarting run showed while it
    waited to restart (REST and GraphQL) and once running again."""
    script = str(workloads.scripts / "ddp_train.py")
    hang = ["python", script, "--steps", "1000", "--sleep", str(SLEEP_S)]
    hang += ["--hang-at", str(HANG_AT)]
    steps = ["python", script, "--steps", str(STEPS), "--sleep", str(STEP_SLEEP_S)]
    out: dict[str, Any] = {}
    # The progress runs start at a minute's start, so that their first step comes in the
    # minute they start running in (a running minute is busy or not as a whole): a run whose
    # first step came in the next minute would count its start idle, the other not.
    now = datetime.now(UTC)
    progress_at = now if now.second < 3 else now.replace(second=0, microsecond=0)
    progress_at += timedelta(minutes=0 if now.second < 3 else 1)
    # The runs end in about six of a rank's starts (three starts, two stall timeouts of one and
    # a half each): an upper bound far above that.
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        if "submitted" not in out and datetime.now(UTC) >= progress_at:
            api.submit(spec("progress-append", workloads, steps, cpu=CPU))
            api.submit(
                spec("progress-overwrite", workloads, [*steps, "--overwrite-progress"], cpu=CPU)
            )
            out["submitted"] = datetime.now(UTC)
        if "hangs" not in out and "submitted" in out and stepping(api):
            out["stall_timeout"] = stall_timeout(api)
            stall = {"cpu": CPU, "stall_timeout": out["stall_timeout"]}
            api.submit(spec("hang-keep", workloads, hang, on_stall="keep", **stall))
            restart = {"restart_policy": "on_failure", "max_restarts": 1}
            api.submit(
                spec("hang-restart", workloads, hang, on_stall="restart", **restart, **stall)
            )
            out["hangs"] = datetime.now(UTC)
        if "hangs" not in out:
            time.sleep(LOOK_EVERY_S)
            continue
        keep = api.graphql(RUN, run="hang-keep")["run"]
        if "stopped" not in out and all(stalls(w) for w in keep["workers"]):
            made = api.graphql('mutation { stopRun(name: "hang-keep") { errors { message } } }')
            assert made["stopRun"]["errors"] == [], made
            out["stopped"] = datetime.now(UTC)
        job = api.job("hang-restart")
        if "waiting" not in out and job["status"] == "Pending" and job["restart_loop"]:
            out["waiting"] = (job, api.graphql(RUN, run="hang-restart")["run"])
        if "again" not in out and "waiting" in out and job["status"] == "Running":
            out["again"] = api.graphql(RUN, run="hang-restart")["run"]
        if all((job if run == "hang-restart" else api.job(run))["status"] in ENDED for run in RUNS):
            out["ended"] = {run: api.job(run) for run in RUNS}
            return out
        time.sleep(LOOK_EVERY_S)
    raise AssertionError(f"not all ended: {[api.job(r) for r in RUNS]}, {out}")


@pytest.fixture(scope="module")
def ledgers(api: Api, seen: dict[str, Any]) -> dict[str, tuple[History, Intervals]]:
    return counted(api, RUNS)


def test_keep_counts_both_ranks_stalled_each_from_its_own_last_progress(
    api: Api, seen: dict[str, Any], ledgers: dict[str, tuple[History, Intervals]]
) -> None:
    # seed G-6: stalled, counted from when it stopped making progress
    stall = stalled(seen)
    assert seen["ended"]["hang-keep"]["status"] == "Stopped"
    history, intervals = ledgers["hang-keep"]
    mine = by_worker(intervals)
    began: dict[int, datetime] = {}
    for worker in history["workers"]:
        rank = int(worker["name"].rsplit("-", 1)[1])
        step, logged = last_step(api.log(worker["name"]), rank, worker["history"])
        assert step == (HANG_AT - 1 if rank == 1 else HANG_AT), worker["name"]
        assert [r for _, r in stalls(worker)] == [stall], worker["history"]
        ((stalled_at, _),) = stalls(worker)
        # dated by when its progress was written (the file's change), not when it was seen
        assert close(stalled_at, logged, 0.5), (worker["name"], stalled_at, logged)
        stop = next(at(h["transitionAt"]) for h in worker["history"] if h["state"] == "Stopping")
        # stalled from its own last progress until its owner stopped it, and only then
        spans = stalled_spans(mine[worker["name"]])
        assert same_spans(spans, [(stalled_at, stop)]), (worker["name"], spans, stalled_at, stop)
        began[rank] = stalled_at
    # each from its own: rank 0 logged a step more, a step's sleep after rank 1
    assert (began[0] - began[1]).total_seconds() > SLEEP_S / 2, began


def test_restart_stalls_both_ranks_and_restarts_after_its_backoff(
    api: Api, seen: dict[str, Any]
) -> None:
    # seed L-68, L-69 (the Restarting in a loop panel, the first wait), L-21, G-7
    stall = stalled(seen)
    job, run = seen["waiting"]
    assert job["reason"] == (
        f"Restarting in {BACKOFF_S}s (1/1): Worker hang-restart-1 stalled on local: "
        f"no progress for {seen['stall_timeout']}"
    ), run["workers"]
    assert job["advice"]["kind"] == "stalled" and run["advice"]["kind"] == "stalled"
    loop = job["restart_loop"]
    assert (loop["restarts"], loop["max_restarts"]) == (1, 1)
    requeued = next(at(h["transition_at"]) for h in job["history"] if h["reason"] == job["reason"])
    assert close(at(loop["restart_at"]), requeued + timedelta(seconds=BACKOFF_S)), loop
    # GraphQL's panel is the REST one's
    panel = run["restartLoop"]
    assert (panel["restarts"], panel["maxRestarts"]) == (1, 1)
    assert close(at(panel["restartAt"]), at(loop["restart_at"])), (panel, loop)
    assert panel["worker"]["name"] == loop["worker"]
    assert panel["worker"]["lastFailure"]["log_tail"] == loop["last_failure"]["log_tail"]
    # Each worker's first attempt: stalled from its own last progress, with its last lines.
    first: dict[int, datetime] = {}
    for worker in run["workers"]:
        rank = int(worker["name"].rsplit("-", 1)[1])
        snapshot = worker["lastFailure"]
        assert snapshot["reason"] == stall, snapshot
        step, logged = last_step(snapshot["log_tail"], rank, worker["history"])
        assert step == (HANG_AT - 1 if rank == 1 else HANG_AT), snapshot
        ((stalled_at, reason),) = stalls(worker)
        assert (reason == stall) if rank == 1 else reason.startswith(STALLED), reason
        assert close(stalled_at, logged, 0.5), (worker["name"], stalled_at, logged)
        first[rank] = stalled_at
        if worker["name"] == loop["worker"]:
            assert loop["last_failure"] == snapshot
    assert (first[0] - first[1]).total_seconds() > SLEEP_S / 2, first
    # running again: the panel stays (the count), the next attempt is no longer ahead
    again = seen["again"]["restartLoop"]
    assert (again["restarts"], again["restartAt"]) == (1, None), again


def test_restart_counts_every_stall_of_both_ranks_and_spends_its_budget(
    api: Api, seen: dict[str, Any], ledgers: dict[str, tuple[History, Intervals]]
) -> None:
    # seed G-6, G-7, G-9, L-56
    stall = stalled(seen)
    job = seen["ended"]["hang-restart"]
    assert (job["status"], job["reason"]) == ("Failed", "Retry budget exhausted after 1/1 restarts")
    assert job["advice"]["kind"] == "retry_budget", job["advice"]
    restart_at = at(seen["waiting"][0]["restart_loop"]["restart_at"])
    first = {w["name"]: stalls(w)[0][0] for w in seen["waiting"][1]["workers"]}
    history, intervals = ledgers["hang-restart"]
    mine = by_worker(intervals)
    began: dict[int, datetime] = {}
    for worker in history["workers"]:
        name = worker["name"]
        rank = int(name.rsplit("-", 1)[1])
        changes = stalls(worker)
        assert len(changes) == 2, worker["history"]  # one per attempt
        assert close(changes[0][0], first[name]), (changes, first)
        # The second attempt: placed once its wait was over, counted as a restart (G-9).
        placed = next(
            at(h["transitionAt"])
            for h in reversed(worker["history"])
            if h["state"] in ("Preparing", "Starting") and at(h["transitionAt"]) > changes[0][0]
        )
        assert restart_at - timedelta(milliseconds=1) <= placed, (placed, restart_at)
        assert placed < restart_at + timedelta(seconds=30), (placed, restart_at)
        # Stalled from each attempt's last progress to its gang's placement again (stopping
        # and waiting to be placed again: G-7), then to the run's end.
        end = at(worker["history"][0]["transitionAt"])
        spans = stalled_spans(mine[name])
        expected = [(changes[0][0], placed), (changes[1][0], end)]
        assert same_spans(spans, expected), (name, spans, expected)
        after = [i for i in mine[name] if close(at(i["start"]), placed)]
        assert [i["category"] for i in after] == ["restart"], (name, mine[name])
        # The second attempt's stall, as its own last lines date it.
        snapshot = api.get(f"/tasks/{name}").json()["last_failure"]
        assert snapshot["reason"] == stall, snapshot
        step, logged = last_step(snapshot["log_tail"], rank)
        assert step == (HANG_AT - 1 if rank == 1 else HANG_AT), snapshot
        assert close(changes[1][0], logged, 0.5), (name, changes[1][0], logged)
        began[rank] = changes[1][0]
    assert (began[0] - began[1]).total_seconds() > SLEEP_S / 2, began


@pytest.mark.parametrize("run", RUNS)
def test_the_ledger_is_the_workers_history_to_the_second(
    api: Api, ledgers: dict[str, tuple[History, Intervals]], run: str
) -> None:
    history, intervals = ledgers[run]
    check_ledger(api, run, history, intervals)


def test_progress_appended_or_overwritten_gives_the_same_goodput(
    api: Api, seen: dict[str, Any], ledgers: dict[str, tuple[History, Intervals]]
) -> None:
    covered = {}
    for run in PROGRESS:
        job = seen["ended"][run]
        assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed"), job
        mine = by_worker(ledgers[run][1])
        stepping = productive = 0.0  # seconds of each rank's own stepping (1 GPU each)
        for rank in (0, 1):
            name = f"{run}-{rank}"
            text = api.log(name)
            steps = [m for m in STEP_LINE.finditer(text) if int(m.group(1)) == rank]
            assert int(steps[-1].group(2)) == STEPS - 1, text
            first = datetime.fromtimestamp(float(steps[0].group(3)), UTC)
            last = datetime.fromtimestamp(float(steps[-1].group(3)), UTC)
            stepping += (last - first).total_seconds()
            for i in mine[name]:
                if i["category"] == "productive":
                    overlap = min(at(i["end"]), last) - max(at(i["start"]), first)
                    productive += max(overlap.total_seconds(), 0.0) * i["gpus"]
        covered[run] = round(productive / stepping, 3)
    # Stepping all along: counted productive all along, whichever way the file is written
    # (before: an appended file was read as no report, 0.157 of the time). Read over the ranks'
    # own stepping only: how long they took to start (PyTorch's import: 66 s in CI, with the
    # suite starting beside it) and what their output counted for meanwhile is not what differs.
    assert min(covered.values()) > 0.95, covered
    assert abs(covered["progress-append"] - covered["progress-overwrite"]) <= 0.05, covered
