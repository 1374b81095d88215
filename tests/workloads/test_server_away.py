"""The server killed (kill -9) for longer than a minute while a real agent's worker steps: the
minutes away are counted as the workload's samples say, productive, not idle (issue 20).

A real `astraeus up` and a real `astraeus agent` with a simulated GPU, whose utilisation
follows the workload's progress reports. While the server is away the agent keeps its samples
(agent/outbox.py) and sends them when it is back; the server's tick may count the minutes away
before they come (as idle: nothing sampled), and counts them again when they do
(accounting.counting.samples_arrived, within rules.LATE_SAMPLES_WINDOW). Real time: the server
has no fake clock. The last tick runs from here, on the server's own database, as the server's
would once the run's last minute is over (tests/workloads/ledger.py's `tick_after`), rather
than waiting up to a minute more for the server's."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from backend.accounting import counting
from backend.db import Database
from backend.models import StateTransition, Worker
from tests.support import WORKLOAD_PYTHON
from tests.support.processes import Cluster
from tests.workloads.ledger import tick_after

AWAY_S = 70  # longer than a minute: at least one whole minute without the server
STEPS = (
    "import time, astraeus_progress\n"
    "end = time.time() + 95\n"
    "i = 0\n"
    "while time.time() < end:\n"
    "    astraeus_progress.report(i)\n"
    "    i += 1\n"
    "    time.sleep(0.5)\n"
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def tails(cluster: Cluster) -> str:
    """The server's and the agent's last lines: why it did not go as planned."""
    logs = [cluster.server.log, *(a.log for a in cluster.agents.values())]
    worker = cluster.get("/tasks/stepper-0/logs?tail=40")
    return "\n".join(
        [f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-40:]) for p in logs]
        + [f"--- stepper-0\n{worker}"]
    )


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


async def phases_of(url: str, run: str) -> list[tuple[datetime, str | None]]:
    """The run's worker's phase changes (its history) as recorded."""
    db = Database.from_url(url)
    try:
        async with db.read() as session:
            rows = await session.execute(
                select(StateTransition.transition_at, StateTransition.phase)
                .join(Worker, Worker.id == StateTransition.worker_id)
                .where(Worker.name == f"{run}-0")
                .order_by(StateTransition.transition_at, StateTransition.id)
            )
            return [(r.transition_at, r.phase) for r in rows]
    finally:
        await db.dispose()


def test_minutes_while_the_server_is_away_are_counted_as_the_samples_say(
    cluster: Cluster,
) -> None:
    cluster.agent("m1").start()
    cluster.submit(
        name="stepper", gpus=1, restart_policy="never", command=[WORKLOAD_PYTHON, "-c", STEPS]
    )
    cluster.wait("running", lambda: cluster.status("stepper") == "Running")
    time.sleep(5)
    assert cluster.server.process is not None
    cluster.server.process.kill()  # kill -9: the agent loses its stream, the worker steps on
    cluster.server.process.wait()
    away_from = time.time()
    time.sleep(AWAY_S)
    away_to = time.time()
    cluster.server.start()
    try:
        cluster.wait("completed", lambda: cluster.status("stepper") == "Completed", seconds=120)
    except AssertionError as error:
        raise AssertionError(f"{error}: {cluster.get('/jobs/stepper')}\n{tails(cluster)}") from None
    ended = at(cluster.get("/jobs/stepper")["ended_at"])
    url = f"sqlite:///{cluster.server.data_dir / 'astraeus.db'}"
    tick_after(url, ended)  # the last tick counts the run's last minute whole
    history = asyncio.run(phases_of(url, "stepper"))

    phases = [p for _, p in history if p is not None]
    assert [p for n, p in enumerate(phases) if n == 0 or phases[n - 1] != p] == [
        "waiting",
        "starting",
        "running",
        "ended",
    ], history
    changes: dict[str, datetime] = {}
    for moment, phase in history:
        if phase is not None:
            changes.setdefault(phase, moment)
    running = (changes["ended"] - changes["running"]).total_seconds()
    starting = (changes["running"] - changes["starting"]).total_seconds()
    waiting = (changes["starting"] - changes["waiting"]).total_seconds()
    assert running > AWAY_S + 10 and away_from > changes["running"].timestamp()

    ledger = cluster.get("/runs/stepper/goodput")
    hours = ledger["gpu_hours"]
    # Every second it ran is productive (1 GPU) but where a minute's piece had no sample at
    # all (the seconds before its first one, or after its last): at most its first and last
    # minutes. The minutes away are productive, as its samples said.
    assert (hours["productive"] + hours["idle"]) * 3600 == pytest.approx(running, abs=1e-3)
    assert hours["productive"] * 3600 >= running - 120, (ledger, history)
    assert hours["starting"] * 3600 == pytest.approx(starting, abs=1e-3)
    assert hours["waiting"] * 3600 == pytest.approx(waiting, abs=1e-3)
    # The ledger is its intervals' sum, to the second, and they tile its history.
    since = int(changes["waiting"].timestamp()) - 3600
    intervals = cluster.get(f"/goodput/intervals?by=run&name=stepper&start={since}")["intervals"]
    sums: dict[str, float] = defaultdict(float)
    for i in intervals:
        sums[i["category"]] += (at(i["end"]) - at(i["start"])).total_seconds() * i["gpus"]
    for category, value in hours.items():
        assert sums.get(category, 0.0) == pytest.approx(value * 3600, abs=1e-3), category
    first = counting.minute_floor(changes["running"]) + timedelta(minutes=1)
    last = counting.minute_floor(changes["ended"])
    for i in intervals:
        start, end = at(i["start"]), at(i["end"])
        if i["category"] == "idle":
            assert end <= first or start >= last, (i, intervals)
        if start.timestamp() < away_to and end.timestamp() > away_from:
            assert i["category"] == "productive", (i, away_from, away_to, intervals)
    spans = sorted((at(i["start"]), at(i["end"])) for i in intervals)
    assert spans[0][0] == changes["waiting"] and spans[-1][1] == changes["ended"]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
