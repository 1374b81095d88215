"""Waiting on real processes: for a condition, polled, and for what /proc says of a process."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], seconds: float = 60, every: float = 0.25) -> T:
    """``check()`` polled until it gives something true, which is returned; after ``seconds``
    the test fails, saying ``what`` it waited for."""
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, f"waited {seconds}s for {what}"
        time.sleep(every)
    return found


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command's name (state, parent, …)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that runs (a zombie waiting for its parent is not)."""
    try:
        return _stat(pid)[0] not in ("Z", "X")
    except OSError:
        return False


def parent(pid: int) -> int:
    return int(_stat(pid)[1])
