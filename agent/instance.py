"""One agent a data folder: the agent running on it holds a lock on its ``agent.pid``, which
names it, for as long as it lives.

Two agents on one data folder would both take back its workers and both report them. The lock
is the kernel's (``flock``), so it goes with the process however the process ends, kill -9
included, and a number left in the file by a dead agent is never taken for a live one.
``astraeus up`` ends the agent an earlier ``up`` left running (it outlives a crash of ``up``
and keeps measuring) before it starts its own: what that agent measured waits in the outbox on
disk for the next one (agent/outbox.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import time
from pathlib import Path

PID_FILE = "agent.pid"
# The agent writes its number as soon as it holds the lock: a reader that finds the lock held
# and the file still empty looks again this often, this long.
READ_POLL_S = 0.02
READ_WAIT_S = 2.0


def claim(data_dir: Path) -> int:
    """Hold ``data_dir``'s lock for this process's life, its pid written in the file; the
    descriptor, kept open (closed on exec: no worker inherits it). SystemExit, naming the
    agent that holds it, when one does."""
    path = data_dir / PID_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        other = holder(data_dir)
        named = f" (pid {other})" if other else ""
        raise SystemExit(
            f"astraeus agent: another agent{named} runs on the data folder {data_dir}; "
            "one agent a data folder"
        ) from None
    os.fchmod(fd, 0o600)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def holder(data_dir: Path) -> int | None:
    """The pid of the agent that holds ``data_dir``'s lock now, or None when none does."""
    path = data_dir / PID_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        deadline = time.monotonic() + READ_WAIT_S
        while _held(fd):
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if text.isdigit():
                return int(text)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} is locked but names no process")
            time.sleep(READ_POLL_S)
        return None
    finally:
        os.close(fd)


def _held(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def end(data_dir: Path, timeout: float = 15) -> int | None:
    """End the agent running on ``data_dir`` as a stop ends one: SIGTERM, then SIGKILL after
    ``timeout`` seconds; its pid once it has ended, or None when none ran. It is named by a
    pidfd opened while it held the lock, so no other process that got its number is signalled."""
    pid = holder(data_dir)
    if pid is None:
        return None
    try:
        process = os.pidfd_open(pid)
    except ProcessLookupError:
        return pid  # ended meanwhile
    try:
        if holder(data_dir) != pid:
            return pid  # ended before the pidfd was opened: the number may be another's now
        for sent, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(process, sent)
            if _ended(process, wait):
                break
    finally:
        os.close(process)
    return pid


def _ended(pidfd: int, timeout: float | None) -> bool:
    """Whether the process ended within ``timeout`` seconds (None: however long it takes)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else int(timeout * 1000)))
