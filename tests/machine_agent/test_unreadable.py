"""A command that names a file its workload's user may not read is not run: the machine reports
the cause UNREADABLE with the file, the user and the folder in the way (issue 36: a script under
/root ended "Exited with code 2" with a program's advice, Python's "Permission denied" in its log
alone). Real shims and real users: workloads change user only under an agent running as root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from astraeus.agent.v1 import agent_pb2

from agent import enter, shim
from agent.executor import EndCause, Exit, ProcessWorker
from agent.logs import WorkerLog
from agent.start import StartSpec
from tests.support import searchable
from tests.support.agents import unconnected_agent

ROOT = Path(__file__).resolve().parents[2]
UID, GID = 2_000_123, 2_100_123
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="workloads change user only under an agent running as root"
)


def _run_as_workload(tmp_path: Path, command: list[str], cwd: Path) -> tuple[Exit | None, str]:
    """The shim runs ``command`` as a user of the range, as the agent's executor has it do."""
    folder = tmp_path / "worker"
    folder.mkdir()
    spec = {
        "worker": "7",
        "argv": command,
        "env": {"PATH": "/usr/bin:/bin"},
        "cwd": str(cwd),
        "log_root": str(tmp_path / "logs"),
        "cgroup": None,
        "cgroup_procs": [],
        "identity": {"uid": UID, "gid": GID, "groups": []},
    }
    (folder / shim.SPEC).write_text(json.dumps(spec))
    log = WorkerLog(tmp_path / "logs", "7")
    log.begin()
    subprocess.run([sys.executable, "-m", "agent.shim", str(folder)], cwd=ROOT, check=True)
    return shim.recorded_exit(folder), log.snapshot()


def _script_in(folder: Path, mode: int = 0o644) -> Path:
    folder.mkdir(mode=0o700)
    script = folder / "train.py"
    script.write_text("print('trained')\n")
    script.chmod(mode)
    return script


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The workload's working folder: its own, as the executor makes it."""
    searchable(tmp_path)
    folder = tmp_path / "home"
    folder.mkdir(mode=0o700)
    os.chown(folder, UID, GID)
    return folder


@as_root
def test_a_script_in_a_folder_its_user_may_not_enter_is_not_run(tmp_path: Path, home: Path) -> None:
    script = _script_in(tmp_path / "private")  # 0700, root's: as /root is
    ended, log = _run_as_workload(tmp_path, ["python3", str(script)], home)
    assert ended == Exit(
        None, EndCause.UNREADABLE, detail=str(script), uid=UID, blocked_at=str(script.parent)
    )
    assert log == (
        f"astraeus: not run: {script}: uid {UID} may not enter {script.parent} "
        "(Permission denied)\n"
    )


@as_root
def test_a_script_its_user_may_not_read_names_no_folder(tmp_path: Path, home: Path) -> None:
    script = _script_in(tmp_path / "open", mode=0o600)
    searchable(script.parent)
    ended, _ = _run_as_workload(tmp_path, ["python3", str(script)], home)
    assert ended == Exit(None, EndCause.UNREADABLE, detail=str(script), uid=UID, blocked_at="")


@as_root
def test_a_working_folder_its_user_may_not_enter_is_named(tmp_path: Path) -> None:
    searchable(tmp_path)
    closed = tmp_path / "project"
    closed.mkdir(mode=0o700)
    ended, _ = _run_as_workload(tmp_path, ["true"], closed)
    assert ended == Exit(
        None, EndCause.UNREADABLE, detail=str(closed), uid=UID, blocked_at=str(closed)
    )


@as_root
def test_a_readable_script_runs(tmp_path: Path, home: Path) -> None:
    script = _script_in(tmp_path / "open")
    searchable(script.parent)
    ended, log = _run_as_workload(tmp_path, ["/usr/bin/python3", str(script)], home)
    assert (ended, log) == (Exit(0, EndCause.EXITED), "trained\n")


@as_root
def test_a_relative_path_is_looked_for_in_the_working_folder(tmp_path: Path, home: Path) -> None:
    (home / "mine.py").write_text("print('x')\n")
    (home / "mine.py").chmod(0o600)  # root's, in the user's own folder: it may not read it
    ended, _ = _run_as_workload(tmp_path, ["python3", "mine.py"], home)
    assert ended == Exit(
        None, EndCause.UNREADABLE, detail=str(home / "mine.py"), uid=UID, blocked_at=""
    )


@as_root
def test_a_file_named_inside_a_shell_command_is_left_to_the_workload(
    tmp_path: Path, home: Path
) -> None:
    # What the machine cannot see (a path inside `bash -c`'s text) fails as the workload does:
    # the advice then hints at the "Permission denied" of its last lines (tests/runs).
    script = _script_in(tmp_path / "private")
    ended, log = _run_as_workload(tmp_path, ["bash", "-c", f"python3 {script}"], home)
    assert ended == Exit(2, EndCause.EXITED)
    assert "[Errno 13] Permission denied" in log


def test_what_a_command_names_is_what_exists(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "data").mkdir()
    argv = ["python3", "train.py", "--epochs", "3", "-c", "print(1)", "data/", str(tmp_path)]
    assert enter.named_paths(argv, str(tmp_path)) == [
        str(tmp_path),
        str(tmp_path / "train.py"),
        str(tmp_path / "data"),
    ]
    # the command itself only when it is a path; a working folder that is not there, not at all
    tool = tmp_path / "bin" / "tool"
    tool.parent.mkdir()
    tool.write_text("")
    assert enter.named_paths([str(tool), "x" * 5000], "/nowhere") == [str(tool)]
    assert enter.named_paths(["tool"], "/nowhere") == []


@pytest.mark.parametrize(
    ("exit", "uid", "blocked_at"),
    [
        (
            Exit(None, EndCause.UNREADABLE, detail="/root/t.py", uid=2000000, blocked_at="/root"),
            2000000,
            "/root",
        ),
        (Exit(2, EndCause.EXITED), None, ""),
    ],
)
def test_the_agent_sends_the_user_and_the_folder_in_the_way(
    tmp_path: Path, exit: Exit, uid: int | None, blocked_at: str
) -> None:
    agent = unconnected_agent(tmp_path / "data")
    worker = ProcessWorker(
        9, StartSpec(attempt=2), WorkerLog(tmp_path / "logs", "9"), tmp_path / "w"
    )
    agent.outgoing.report(worker, agent_pb2.WORKER_STATE_EXITED, exit)
    event = agent.outgoing.queue.get_nowait().worker_event
    assert event.cause == agent_pb2.EndCause.Value(f"END_CAUSE_{exit.cause.upper()}")
    assert (event.uid if event.HasField("uid") else None, event.blocked_at) == (uid, blocked_at)
    assert (event.detail, event.reason) == (exit.detail, "")
