"""Opening a workload's file as root without being led elsewhere.

A Slurm node's agent reads what a job writes in its run's folder (its log, its progress file) on
a filesystem the job's user can write. That user could put a link where the agent looks (its
log's folder pointing at another run's, its log at /etc/shadow): every part of the path beneath
the trusted folder is opened without following links, one folder at a time, and only a regular
file is read.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def parts(relative: str) -> list[str]:
    """The names of a path beneath a folder; ValueError for one that leaves it."""
    names = [p for p in relative.split("/") if p not in ("", ".")]
    if relative.startswith("/") or not names or ".." in names:
        raise ValueError(f"not a path beneath its folder: {relative!r}")
    return names


def open_folder(root: Path, relative: str) -> int:
    """A descriptor of the folder ``relative`` beneath ``root`` (a trusted path: the machine's
    owner may have made it a link), no part beneath it a link; OSError otherwise."""
    names = parts(relative)
    current = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            following = os.open(name, _DIRECTORY, dir_fd=current)
            os.close(current)
            current = following
    except OSError:
        os.close(current)
        raise
    return current


def open_file(folder: int, relative: str) -> int:
    """A descriptor of the regular file ``relative`` beneath the folder's descriptor, no part
    of its path a link; OSError otherwise (not there yet, a link, a FIFO, a folder)."""
    names = parts(relative)
    current = folder
    try:
        for name in names[:-1]:
            following = os.open(name, _DIRECTORY, dir_fd=current)
            if current != folder:
                os.close(current)
            current = following
        fd = os.open(names[-1], _FILE, dir_fd=current)
    finally:
        if current != folder:
            os.close(current)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{relative} is not a regular file")
    return fd


def close(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
