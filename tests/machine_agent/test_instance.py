"""One agent a data folder (agent/instance.py): the running agent's lock names it, goes with it
however it ends, is not inherited by what it starts, and ends it on request (issue 36: the
next `astraeus up` ends the agent a crashed one left running)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import instance
from tests.e2e.live import ASTRAEUS

# Holds the folder's lock, starts a child that could inherit it, says both pids, then waits.
HOLDER = (
    "import signal, subprocess, sys, time\n"
    "from pathlib import Path\n"
    "from agent import instance\n"
    "if sys.argv[2] == 'stubborn':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "instance.claim(Path(sys.argv[1]))\n"
    "child = subprocess.Popen(['sleep', '600'], close_fds=False)\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


class Holder:
    def __init__(self, folder: Path, *, stubborn: bool = False) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder), "stubborn" if stubborn else "plain"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.child = int(self.process.stdout.readline())  # once it holds the lock

    def close(self) -> None:
        for pid in (self.process.pid, self.child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    try:
        yield started
    finally:
        for holder in started:
            holder.close()


def test_a_second_agent_on_a_data_folder_is_refused_naming_the_first(
    tmp_path: Path, holders: list[Holder]
) -> None:
    holders.append(first := Holder(tmp_path))
    assert instance.holder(tmp_path) == first.process.pid
    assert (tmp_path / instance.PID_FILE).stat().st_mode & 0o777 == 0o600

    refused = subprocess.run(
        [
            ASTRAEUS,
            "agent",
            "--data-dir",
            str(tmp_path),
            "--token",
            "astj_x",
            "--server",
            "127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert refused.stderr == (
        f"astraeus agent: another agent (pid {first.process.pid}) runs on the data folder "
        f"{tmp_path}; one agent a data folder\n"
    )
    assert instance.holder(tmp_path) == first.process.pid  # the first one's, untouched


def test_the_lock_goes_with_its_agent_killed_not_with_what_it_started(
    tmp_path: Path, holders: list[Holder]
) -> None:
    holders.append(first := Holder(tmp_path))
    first.process.kill()
    first.process.wait()
    os.kill(first.child, 0)  # its child runs on, as a worker outlives its agent
    assert instance.holder(tmp_path) is None  # though the file still names the dead one
    assert (tmp_path / instance.PID_FILE).read_text() == f"{first.process.pid}\n"
    assert instance.end(tmp_path) is None

    fd = instance.claim(tmp_path)  # the next agent
    try:
        assert instance.holder(tmp_path) == os.getpid()
    finally:
        os.close(fd)


def test_end_stops_the_agent_holding_the_folder_with_sigterm_then_sigkill(
    tmp_path: Path, holders: list[Holder]
) -> None:
    for name in ("plain", "stubborn"):
        (tmp_path / name).mkdir()
    holders.append(plain := Holder(tmp_path / "plain"))
    assert instance.end(tmp_path / "plain") == plain.process.pid
    assert plain.process.wait() == -signal.SIGTERM
    assert instance.holder(tmp_path / "plain") is None

    holders.append(stubborn := Holder(tmp_path / "stubborn", stubborn=True))
    assert instance.end(tmp_path / "stubborn", timeout=0.2) == stubborn.process.pid
    assert stubborn.process.wait() == -signal.SIGKILL
    assert instance.holder(tmp_path / "stubborn") is None
