"""`astraeus up` killed -9 while a workload steps, and started again on its data folder over a
minute later: its local agent measured the workload all along, the next `up` replaced it with
its own, which sent what it measured, and the minutes away are counted productive, to the
second (issue 36: "a crash of `astraeus up` loses the minutes it was down").

Real processes throughout: `astraeus up` with its local agent (one simulated GPU busy while the
workload's step moves), a workload that reports a step every half second. The ledger is checked
against the workers' histories (tests/workloads/ledger.py), and the minutes away against the
samples taken in them: a minute whose GPU was busy 5% or more is productive (the seed's table).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from astraeus.agent.v1 import agent_pb2

from agent import instance
from backend.accounting import counting
from tests.e2e.live import Server, free_port
from tests.support import WORKLOAD_PYTHON
from tests.support.waiting import alive, parent, wait_for
from tests.workloads.ledger import Api, at, check_ledger, counted

# Steps until the test says it is done (a file appears), ten minutes at most.
STEPS = (
    "import os, sys, time, astraeus_progress\n"
    "end = time.time() + 600\n"
    "i = 0\n"
    "while time.time() < end and not os.path.exists(sys.argv[1]):\n"
    "    astraeus_progress.report(i)\n"
    "    i += 1\n"
    "    time.sleep(0.5)\n"
)
BUSY = 0.05  # the seed's "its GPUs busy (5% or more)"
MINUTE = timedelta(minutes=1)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    up = Server(tmp_path / "data", free_port(), scheduler_interval="1s")
    try:
        yield up
    finally:
        up.stop()  # and the agent a killed `up` left running, and its workers (end_agent)


@pytest.fixture
def done() -> Iterator[Path]:
    """Where the test says the workload is done: a folder its user (one of its own when the
    agent runs as root) can look into."""
    folder = Path(tempfile.mkdtemp(prefix="astraeus-up-crash-"))
    folder.chmod(0o755)
    try:
        yield folder / "done"
    finally:
        shutil.rmtree(folder)


def agents_on(data_dir: Path) -> set[int]:
    """Every live `astraeus agent` process of this data folder on the machine. A child the
    agent forked to run a program shows the agent's command line until it runs the program
    (in one CI run a pid next to the agent's was seen so): it is the agent's own work, not a
    second agent, and is left out."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
            if "agent" in argv and f"--data-dir\0{data_dir}\0" in "\0".join(argv) + "\0":
                pid = int(cmdline.parent.name)
                if alive(pid):
                    found.add(pid)
    agents = set()
    for pid in found:
        with contextlib.suppress(OSError):  # (gone meanwhile: not an agent now)
            if parent(pid) not in found:
                agents.add(pid)
    return agents


def busy(api: Api, since: float, until: float) -> list[tuple[float, float]]:
    """The run's GPU utilisation samples the server holds, (Unix s, value), in time order."""
    answer = api.get(
        "/metrics/range",
        metric="task_gpu_utilization_ratio",
        match="run:stepper",
        start=int(since * 1000),
        end=int(until * 1000),
        step="1s",
    ).json()
    series = answer["series"]
    return [(t / 1000, v) for t, v in series[0]["points"]] if series else []


def outbox(agent_dir: Path) -> list[Path]:
    return sorted((agent_dir / "outbox").glob("*.pb"))


def whole_minutes(start: float, end: float) -> list[datetime]:
    first = counting.minute_floor(datetime.fromtimestamp(start, UTC)) + MINUTE
    last = counting.minute_floor(datetime.fromtimestamp(end, UTC))
    return [first + n * MINUTE for n in range((last - first) // MINUTE)]


def test_a_crash_of_up_loses_no_minute_of_what_its_workload_did(
    server: Server, tmp_path: Path, done: Path
) -> None:
    server.start()
    api = Api(server, server.admin_token)
    agent_dir = server.data_dir / "agent"
    api.submit(
        {
            "name": "stepper",
            "gpus": 1,
            "restart_policy": "never",
            "command": [WORKLOAD_PYTHON, "-c", STEPS, str(done)],
        }
    )
    submitted = time.time()
    wait_for("running", lambda: api.job("stepper")["status"] == "Running", 60)
    wait_for(
        "its GPU busy on the server",
        lambda: any(v >= BUSY for _, v in busy(api, submitted - 60, time.time() + 60)),
        60,
    )
    assert server.process is not None
    first = instance.holder(agent_dir)
    assert first is not None and parent(first) == server.process.pid

    server.process.kill()  # kill -9: no goodbye to its agent
    server.process.wait()
    away_from = time.time()
    # Away over a whole minute: up to its next minute, and the whole one after it.
    back_at = (
        counting.minute_floor(datetime.fromtimestamp(away_from, UTC)) + 2 * MINUTE
    ).timestamp()
    while time.time() < back_at + 1:
        assert alive(first), "the local agent ended with `up`"
        time.sleep(1)
    assert instance.holder(agent_dir) == first
    # What it measured meanwhile waits on disk, for whichever agent sends it.
    kept = [agent_pb2.AgentMessage.FromString(p.read_bytes()) for p in outbox(agent_dir)]
    samples = [s for m in kept for s in (*m.metrics.samples, *m.report.metrics.samples)]
    assert any(s.at_ms > away_from * 1000 for s in samples), kept  # as batches or in reports

    server.log = tmp_path / "up-again.log"  # the first agent still writes to the first one
    away_to = time.time()
    printed = server.start()
    assert f"local agent: the one an earlier astraeus up left running (pid {first}) ended" in (
        printed
    )
    assert not alive(first)
    wait_for("the new `up`'s agent", lambda: instance.holder(agent_dir) not in (None, first), 30)
    second = instance.holder(agent_dir)
    assert second is not None and parent(second) == server.process.pid
    assert agents_on(agent_dir) == {second}  # one agent for the machine, the new `up`'s
    machines = api.graphql("{ machines { name state } }")["machines"]
    assert machines == [{"name": "local", "state": "ready"}]

    # What the first agent measured while `up` was away arrives, then the second's own.
    minutes = whole_minutes(away_from, away_to)
    assert minutes, (away_from, away_to)

    def measured() -> bool:
        points = busy(api, away_from - 60, time.time() + 60)
        taken = {counting.minute_floor(datetime.fromtimestamp(t, UTC)) for t, _ in points}
        return set(minutes) <= taken and any(t > away_to for t, _ in points)

    wait_for("the samples of the minutes away", measured, 90)
    done.touch()
    wait_for("completed", lambda: api.job("stepper")["status"] == "Completed", 60)

    history, intervals = counted(api, ["stepper"])["stepper"]
    check_ledger(api, "stepper", history, intervals)
    # Each whole minute away: its samples say busy, its intervals say productive, all of it.
    points = busy(api, away_from - 60, away_to + 60)
    for minute in minutes:
        taken = [v for t, v in points if minute.timestamp() <= t < (minute + MINUTE).timestamp()]
        assert taken and sum(taken) / len(taken) >= BUSY, (minute, taken)
        overlap: dict[str, timedelta] = defaultdict(timedelta)
        for i in intervals:
            start, end = max(at(i["start"]), minute), min(at(i["end"]), minute + MINUTE)
            if start < end:
                overlap[i["category"]] += end - start
        assert overlap == {"productive": MINUTE}, (minute, intervals)
    # And every second away, to the millisecond.
    away = (datetime.fromtimestamp(away_from, UTC), datetime.fromtimestamp(away_to, UTC))
    productive = timedelta(0)
    for i in intervals:
        start, end = max(at(i["start"]), away[0]), min(at(i["end"]), away[1])
        if start < end:
            assert i["category"] == "productive", (i, away)
            productive += end - start
    assert abs((productive - (away[1] - away[0])).total_seconds()) < 0.001

    # A clean stop of `up` stops its agent.
    server.process.send_signal(signal.SIGINT)
    assert server.process.wait(timeout=30) == 0
    assert not alive(second) and agents_on(agent_dir) == set()
