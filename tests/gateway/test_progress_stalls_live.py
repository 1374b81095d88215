"""A hung gang, live (issue 20): a real server and a real `astraeus agent`; two ranks report their
steps through the SDK, both hang at the same step (rank 1 a second later) and then only print a
retry warning twice a second, as ranks waiting on a rendezvous do. With `on_stall: restart`,
both are counted stalled, each from its own last step, dated when its progress file was written
(seed G-6, G-7); their output does not hide the stall."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.live import AgentProcess, Api, Server, free_port
from tests.support import WORKLOAD_PYTHON

HANGS = (
    "import os, time, astraeus_progress\n"
    "rank = int(os.environ['RANK'])\n"
    "for step in range(10):\n"
    "    astraeus_progress.report(step)\n"
    "    time.sleep(0.2)\n"
    "time.sleep(1.2 * rank)\n"
    "astraeus_progress.report(10)\n"
    "print(f'hung at {time.time():.3f}', flush=True)\n"
    "for _ in range(1200):\n"
    "    print('[W socket.cpp:464] retrying the rendezvous', flush=True)\n"
    "    time.sleep(0.5)\n"
)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Server, Api]]:
    server = Server(
        tmp_path / "data", free_port(), local_agent=False, lease_time="8s", scheduler_interval="1s"
    )
    server.start()
    agent = AgentProcess(server, "m1", tmp_path / "m1")
    agent.start()
    try:
        yield server, Api(server, server.admin_token)
    finally:
        agent.end()
        server.stop()


def wait(what: str, check: object, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"waited {seconds}s for {what}"
        time.sleep(0.25)


def stalled_phases(server: Server, worker: str) -> list[tuple[datetime, str]]:
    """The worker's transitions as the server recorded them (its own database, read only)."""
    with sqlite3.connect(f"file:{server.data_dir / 'astraeus.db'}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT t.transition_at, t.phase FROM state_transitions t "
            "JOIN workers w ON w.id = t.worker_id WHERE w.name = ? ORDER BY t.id",
            (worker,),
        ).fetchall()
    return [(datetime.fromisoformat(str(at)), str(phase)) for at, phase in rows]


def test_both_ranks_of_a_hung_gang_are_stalled_from_their_own_last_step(
    live: tuple[Server, Api],
) -> None:
    server, api = live
    created = api.graphql(
        "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }",
        s={
            "name": "hung",
            "workers": 2,
            "gpus": 1,
            "stall_timeout": "4s",
            "on_stall": "restart",
            "max_restarts": 0,
            "command": [WORKLOAD_PYTHON, "-c", HANGS],
        },
    )
    assert created["createRun"]["errors"] == []
    wait("the gang stopped", lambda: api.get("/jobs/hung")["status"] == "Failed", seconds=90)
    assert api.get("/jobs/hung")["reason"] == "Worker hung-0 stalled on m1: no progress for 4s"
    hung_at = {}
    for rank in (0, 1):
        log = api.get(f"/tasks/hung-{rank}/logs?tail=1000")["logs"].splitlines()
        assert log[0].startswith("hung at ") and "retrying the rendezvous" in log[-1]
        hung_at[rank] = float(log[0].split()[-1])
    assert 0.5 <= hung_at[1] - hung_at[0] < 3.0  # rank 1 stopped later than rank 0
    for rank in (0, 1):
        phases = stalled_phases(server, f"hung-{rank}")
        names = [phase for _, phase in phases]
        assert names[names.index("running") :] == ["running", "stalled", "stopping:stall", "ended"]
        stalled_at = phases[names.index("stalled")][0].timestamp()
        # Dated when its last step was written (the progress file's change), not when the
        # agent looked (every second here) nor when its last warning was printed.
        assert abs(stalled_at - hung_at[rank]) < 0.3, (rank, stalled_at, hung_at[rank])
