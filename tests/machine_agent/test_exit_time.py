"""A worker's end is dated when its process ended (issue 20): the first failure of a gang is the
earliest process end, not the first end its agent noticed (DESIGN §3, seed L-59)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from astraeus.agent.v1 import agent_pb2

from agent import shim
from agent.executor import EndCause, Exit, ProcessWorker
from agent.logs import WorkerLog
from agent.start import StartSpec
from tests.support.agents import unconnected_agent

ROOT = Path(__file__).resolve().parents[2]


def test_the_shim_dates_the_end_when_the_process_ended_not_when_its_output_closed(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "worker"
    folder.mkdir()
    # The process exits at once; a child it left holds its output open for two seconds more.
    command = ["/bin/sh", "-c", "(sleep 2; echo late) & echo bye; exit 3"]
    spec = {
        "worker": "7",
        "argv": command,
        "env": {"PATH": "/usr/bin:/bin"},
        "cwd": str(tmp_path),
        "log_root": str(tmp_path / "logs"),
        "cgroup": None,
        "cgroup_procs": [],
        "identity": None,
    }
    (folder / shim.SPEC).write_text(json.dumps(spec))
    WorkerLog(tmp_path / "logs", "7").begin()  # as the agent does before it starts the shim
    started_ms = int(time.time() * 1000)
    subprocess.run([sys.executable, "-m", "agent.shim", str(folder)], cwd=ROOT, check=True)
    closed_ms = int(time.time() * 1000)
    recorded = shim.recorded_exit(folder)
    assert recorded is not None
    assert recorded == Exit(3, EndCause.EXITED)
    at_ms = recorded.at_ms
    assert at_ms is not None and started_ms <= at_ms < started_ms + 1500 < closed_ms
    assert WorkerLog(tmp_path / "logs", "7").tail(10)[0] == "bye\nlate\n"  # all of it, still


def test_the_agent_reports_an_exit_at_the_time_the_process_ended(tmp_path: Path) -> None:
    agent = unconnected_agent(tmp_path / "data")
    worker = ProcessWorker(
        9, StartSpec(attempt=2), WorkerLog(tmp_path / "logs", "9"), tmp_path / "workers" / "9"
    )
    worker.keep()
    shim.record_exit(worker.folder, Exit(1, EndCause.EXITED, at_ms=1_700_000_000_246))
    ended = worker.ended()
    assert ended == Exit(1, EndCause.EXITED) and ended.at_ms == 1_700_000_000_246
    agent.outgoing.report(worker, agent_pb2.WORKER_STATE_EXITED, ended)
    event = agent.outgoing.queue.get_nowait().worker_event
    assert (event.worker_id, event.attempt, event.exit_code, event.at_ms) == (
        9,
        2,
        1,
        1_700_000_000_246,
    )
    # A state change that is not an end is dated when it is reported.
    before = int(time.time() * 1000)
    agent.outgoing.report(worker, agent_pb2.WORKER_STATE_RUNNING)
    assert agent.outgoing.queue.get_nowait().worker_event.at_ms >= before
