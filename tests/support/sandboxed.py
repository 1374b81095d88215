"""What the tests share with workloads, now that a workload's /tmp and /var/tmp are its own
(issue 37: agent/sandbox.py), and the workload user ids each test agent gives out.

A test's folders that workloads reach (their scripts, the markers they wait for, the
checkpoints they share, an agent's data folder) are pytest's and tempfile's: both are moved
out of /tmp, to ``TEMP_ROOT``, for the whole test process and those it starts, when the tests
run as root (an agent as root sandboxes its workers; one that is not gives no sandbox).

Two agents on one machine may not give out the same user ids (issue 37 N9: the second is
refused), and the tests start many at once, in parallel lanes: each gets a range of its own
(``workload_uids``), held by a lock on its file in a folder every lane shares, as the test
servers' master port ranges are (tests/e2e/live.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import signal
import socket
import tempfile
import weakref
from pathlib import Path

TEMP_ROOT = Path("/var/lib/astraeus-tests")
FIRST_UID, RANGE_UIDS, RANGES = 3_000_000, 1000, 900  # 3 000 000-3 899 999


def move_temp_out_of_tmp() -> None:
    """pytest's and tempfile's folders under TEMP_ROOT (as root only): a workload's /tmp is its
    own, and would not hold what a test puts there for it.

    A folder of its own for each test session (its lanes share it: they inherit the variables):
    every pytest session that starts makes its ``pytest-of-root`` 0700 again, and a session
    sharing it with a running one would cut that one's workloads off from their own folders
    (made searchable, tests/support/__init__.py: a workload stepping while another session
    started failed "Permission denied" on its progress file)."""
    if os.geteuid() != 0:
        return
    TEMP_ROOT.mkdir(mode=0o711, exist_ok=True)
    session = TEMP_ROOT / str(os.getpid())
    for variable in ("PYTEST_DEBUG_TEMPROOT", "TMPDIR"):
        given = os.environ.get(variable, "/tmp")
        if any(Path(given).is_relative_to(top) for top in ("/tmp", "/var/tmp")):
            _sweep_sessions()
            session.mkdir(mode=0o711, exist_ok=True)
            os.environ[variable] = str(session)  # else the caller's own choice, kept
    tempfile.tempdir = None  # looked up again, from TMPDIR


def _sweep_sessions() -> None:
    """The folders of test sessions that have ended (their process is gone)."""
    for folder in TEMP_ROOT.iterdir():
        pid = folder.name
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


# Locks every lane shares, in the machine's own /tmp (never a test's folder).
_LOCKS = Path("/tmp/astraeus-test-workload-uids")
_HELD: list[int] = []


def workload_uids(owner: object | None = None) -> str:
    """A range of user ids of its own for one agent (``FIRST-LAST``, for --workload-uids),
    held until ``owner`` is collected (None: this process's life)."""
    _LOCKS.mkdir(exist_ok=True)
    for index in random.sample(range(RANGES), RANGES):
        fd = os.open(_LOCKS / str(index), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if owner is None:
            _HELD.append(fd)
        else:
            weakref.finalize(owner, os.close, fd)
        first = FIRST_UID + index * RANGE_UIDS
        return f"{first}-{first + RANGE_UIDS - 1}"
    raise AssertionError("every workload uid range is held by a test agent of this machine")


def uid_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    return int(first), int(last)


_MINE: list[tuple[int, int]] = []


def process_uids() -> tuple[int, int]:
    """This test process's own range, for the agents it runs in itself (one range however
    many: their workers' ids differ, and so do their user ids)."""
    if not _MINE:
        _MINE.append(uid_range(workload_uids()))
    return _MINE[0]


def end_workloads(uids: str) -> None:
    """Kill every process of a user of ``uids`` (an agent's range, ``FIRST-LAST``): the
    workloads of an agent that is gone for good (an agent that stops leaves them running, for
    the next one to take up), so that none runs on after its test."""
    first, last = uid_range(uids)
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):  # ended meanwhile
            if first <= os.stat(f"/proc/{pid}").st_uid <= last:
                os.kill(int(pid), signal.SIGKILL)


def connects_as(uid: int, port: int, host: str = "127.0.0.1") -> bool:
    """Whether a process of user ``uid`` (and its group of the same number) reaches
    ``host:port``: the machine's network rules match a connection by its user."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            with socket.create_connection((host, port), timeout=5):
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0
