"""How a worker ended travels as a typed cause, never a sentence (issue 22): the shim records the
cause and its facts, the agent sends them as proto EndCause, the server writes the sentence."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from astraeus.agent.v1 import agent_pb2

from agent import shim
from agent.executor import EndCause, Exit, ProcessWorker
from agent.identity import WorkloadUsers
from agent.logs import WorkerLog
from agent.start import StartSpec
from tests.support.agents import unconnected_agent

ROOT = Path(__file__).resolve().parents[2]


def _shim_runs(tmp_path: Path, command: list[str]) -> Exit | None:
    folder = tmp_path / "worker"
    folder.mkdir()
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
    WorkerLog(tmp_path / "logs", "7").begin()
    subprocess.run([sys.executable, "-m", "agent.shim", str(folder)], cwd=ROOT, check=True)
    return shim.recorded_exit(folder)


def test_a_worker_killed_by_a_signal_is_signalled_with_its_number(tmp_path: Path) -> None:
    # The shell's convention for its code (128 + 9), and the signal itself beside it.
    assert _shim_runs(tmp_path, ["sh", "-c", "kill -9 $$"]) == Exit(
        137, EndCause.SIGNALLED, signal=9
    )


def test_a_worker_that_exits_by_itself_is_exited_with_its_code(tmp_path: Path) -> None:
    assert _shim_runs(tmp_path, ["sh", "-c", "exit 137"]) == Exit(137, EndCause.EXITED)


# issue 36: the worker's end is its main process's (tests/machine_agent/test_oom.py, live)
@pytest.mark.parametrize(
    ("returncode", "kills_before", "kills_after", "killed"),
    [
        (-9, 0, 1, True),  # the main process itself, killed by the kernel
        (137, 2, 3, True),  # a shell that ran it, reporting it killed
        (0, 0, 1, False),  # a child killed; the main process went on and exited 0
        (1, 0, 1, False),  # a child killed; the main process gave up on its own
        (-15, 0, 1, False),  # a child killed; the main process stopped by SIGTERM
        (-9, 1, 1, False),  # killed, not for memory this time (the count did not move)
        (137, 0, 0, False),
    ],
)
def test_only_a_main_process_killed_for_memory_is_oom_killed(
    returncode: int, kills_before: int, kills_after: int, killed: bool
) -> None:
    assert shim.killed_for_memory(returncode, kills_before, kills_after) is killed


# issue 36: a container's end, written down, keeps that a child of it was killed for memory
def test_a_kill_seen_beside_an_end_is_written_down_with_it(tmp_path: Path) -> None:
    for folder, seen in ((tmp_path / "a", True), (tmp_path / "b", False)):
        folder.mkdir()
        shim.record_exit(folder, Exit(0, EndCause.EXITED, at_ms=5, oom_kill_seen=seen))
        recorded = shim.recorded_exit(folder)
        assert recorded == Exit(0, EndCause.EXITED)
        assert recorded is not None and recorded.oom_kill_seen is seen
    assert "oom_kill_seen" not in json.loads((tmp_path / "b" / shim.EXIT).read_text())


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ({"code": 1, "reason": "Exited with code 1", "at_ms": 5}, Exit(1, EndCause.EXITED)),
        ({"code": None, "reason": "Lost", "at_ms": 5}, Exit(None, EndCause.LOST)),
    ],
)
def test_an_exit_a_shim_of_an_agent_before_causes_wrote_is_read_by_its_code(
    tmp_path: Path, written: dict[str, object], read: Exit
) -> None:
    (tmp_path / shim.EXIT).write_text(json.dumps(written))
    recorded = shim.recorded_exit(tmp_path)
    assert recorded == read and recorded is not None and recorded.at_ms == 5


def test_a_worker_without_a_command_ends_not_found_127(tmp_path: Path) -> None:
    worker = ProcessWorker(
        9, StartSpec(attempt=1), WorkerLog(tmp_path / "logs", "9"), tmp_path / "w"
    )
    worker.users = WorkloadUsers(switch=False)  # as the agent's user: no uid to allocate
    worker.keep()
    asyncio.run(worker.start())
    assert worker.ended() == Exit(127, EndCause.NOT_FOUND)


@pytest.mark.parametrize(
    ("exit", "cause"),
    [
        (Exit(0, EndCause.EXITED), agent_pb2.END_CAUSE_EXITED),
        (Exit(137, EndCause.OOM_KILLED), agent_pb2.END_CAUSE_OOM_KILLED),
        (Exit(143, EndCause.SIGNALLED, signal=15), agent_pb2.END_CAUSE_SIGNALLED),
        (Exit(127, EndCause.NOT_FOUND), agent_pb2.END_CAUSE_NOT_FOUND),
        (Exit(None, EndCause.LOST), agent_pb2.END_CAUSE_LOST),
        (Exit(None, EndCause.LOST_BEFORE_START), agent_pb2.END_CAUSE_LOST_BEFORE_START),
        (Exit(None, EndCause.IMAGE_PULL, detail="denied"), agent_pb2.END_CAUSE_IMAGE_PULL),
        (Exit(None, EndCause.NOT_STARTED, detail="no drive"), agent_pb2.END_CAUSE_NOT_STARTED),
        (Exit(None, EndCause.STOPPED_BEFORE_START), agent_pb2.END_CAUSE_STOPPED_BEFORE_START),
    ],
)
def test_the_agent_sends_the_cause_and_its_facts_and_no_sentence(
    tmp_path: Path, exit: Exit, cause: int
) -> None:
    agent = unconnected_agent(tmp_path / "data")
    worker = ProcessWorker(
        9, StartSpec(attempt=2), WorkerLog(tmp_path / "logs", "9"), tmp_path / "w"
    )
    agent.outgoing.report(worker, agent_pb2.WORKER_STATE_EXITED, exit)
    event = agent.outgoing.queue.get_nowait().worker_event
    assert (event.cause, event.detail, event.reason) == (cause, exit.detail, "")
    assert (event.signal if event.HasField("signal") else None) == exit.signal
    assert (event.exit_code if event.HasField("exit_code") else None) == exit.code
