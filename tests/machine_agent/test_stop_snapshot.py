"""A worker the server stopped sends its last lines with its end (issue 20): the server keeps
them as the failure snapshot of an attempt stopped at its time limit, preempted or stalled, or
of a machine's lost attempt, whatever the exit code (a workload that saves and exits 0 on
SIGTERM too). An end nobody asked for sends them only when it failed (seed L-21). An attempt
that never started sends none: its log holds an earlier attempt's lines (issue 36)."""

from __future__ import annotations

from pathlib import Path

import pytest
from astraeus.agent.v1 import agent_pb2

from agent.executor import EndCause, Exit, ProcessWorker
from agent.logs import WorkerLog
from agent.start import StartSpec
from tests.support.agents import unconnected_agent


@pytest.mark.parametrize(
    ("stopping", "code", "sent"),
    [
        (False, 0, False),  # completed: nothing to keep
        (False, 1, True),  # failed
        (True, 0, True),  # stopped by the server, exited cleanly on SIGTERM
        (True, 143, True),  # stopped by the server, killed
    ],
)
def test_the_last_lines_go_with_a_failure_and_with_a_stop(
    tmp_path: Path, stopping: bool, code: int, sent: bool
) -> None:
    agent = unconnected_agent(tmp_path / "data")
    log = WorkerLog(tmp_path / "logs", "9")
    log.begin()
    log.append(b"".join(f"step {i}\n".encode() for i in range(80)))
    worker = ProcessWorker(9, StartSpec(attempt=2), log, tmp_path / "workers" / "9")
    worker.started, worker.stopping = True, stopping
    agent.outgoing.report(worker, agent_pb2.WORKER_STATE_EXITED, Exit(code, EndCause.EXITED))
    event = agent.outgoing.queue.get_nowait().worker_event
    expected = "".join(f"step {i}\n" for i in range(30, 80)) if sent else ""  # the last 50
    assert (event.exit_code, event.log_tail) == (code, expected)


@pytest.mark.parametrize(
    ("stopping", "exit"),
    [
        (False, Exit(None, EndCause.NOT_STARTED, detail="MASTER_PORT 25404 is in use")),
        (True, Exit(None, EndCause.STOPPED_BEFORE_START)),
    ],
)
def test_an_attempt_that_never_started_sends_no_earlier_attempts_lines(
    tmp_path: Path, stopping: bool, exit: Exit
) -> None:
    agent = unconnected_agent(tmp_path / "data")
    log = WorkerLog(tmp_path / "logs", "9")
    log.begin()
    log.append(b"[rank0]: RuntimeError: Connection closed by peer\n")  # attempt 1's end
    worker = ProcessWorker(9, StartSpec(attempt=2), log, tmp_path / "workers" / "9")
    worker.stopping = stopping  # not started
    agent.outgoing.report(worker, agent_pb2.WORKER_STATE_EXITED, exit)
    event = agent.outgoing.queue.get_nowait().worker_event
    assert (event.cause, event.detail, event.log_tail) == (
        agent_pb2.EndCause.Value(f"END_CAUSE_{exit.cause.upper()}"),
        exit.detail,
        "",
    )
