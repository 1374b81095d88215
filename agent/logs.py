"""Workers' logs on the machine's disk: written as the worker prints, read on request.

Each worker has a folder with its current log; when its process is removed the last 1 000
lines are kept as the archived log, served until a new process of the same worker replaces
them. Logs are never sent anywhere unless asked.
"""

from __future__ import annotations

import contextlib
import shutil
from collections import deque
from pathlib import Path

ARCHIVED_LINES = 1000
SNAPSHOT_LINES = 50
SNAPSHOT_BYTES = 16 * 1024
MAX_LOG_BYTES = 64 * 2**20  # the current log is cut back to its last half past this


class WorkerLog:
    def __init__(self, root: Path, worker: str) -> None:
        self.folder = root / worker
        self.current = self.folder / "current.log"
        self.archived = self.folder / "archived.log"

    def begin(self) -> None:
        """A new process of the worker: its log replaces what was shown before."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.current.write_bytes(b"")
        self.archived.unlink(missing_ok=True)

    def append(self, data: bytes) -> None:
        with self.current.open("ab") as f:
            f.write(data)
        if self.current.stat().st_size > MAX_LOG_BYTES:
            self._cut_back()

    def _cut_back(self) -> None:
        data = self.current.read_bytes()
        keep = data[len(data) // 2 :]
        keep = keep[keep.find(b"\n") + 1 :]
        self.current.write_bytes(keep)

    def size(self) -> int:
        """The current log's size in bytes (0 when there is none)."""
        try:
            return self.current.stat().st_size
        except OSError:
            return 0

    def tail(self, lines: int) -> tuple[str, bool]:
        """The last lines, and whether they come from a process that no longer exists."""
        if self.current.exists():
            return _last_lines(self.current, lines), False
        if self.archived.exists():
            return _last_lines(self.archived, lines), True
        return "", False

    def snapshot(self) -> str:
        """The failure snapshot's output: the last 50 lines, at most 16 KiB."""
        text = _last_lines(self.current, SNAPSHOT_LINES) if self.current.exists() else ""
        data = text.encode()
        if len(data) > SNAPSHOT_BYTES:
            data = data[-SNAPSHOT_BYTES:]
            text = data.decode(errors="ignore")
        return text

    def archive(self) -> None:
        """The process is gone: keep its last 1 000 lines."""
        if self.current.exists():
            self.archived.write_text(_last_lines(self.current, ARCHIVED_LINES))
            self.current.unlink()

    def delete(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _last_lines(path: Path, count: int) -> str:
    with path.open("r", errors="replace") as f:
        return "".join(deque(f, maxlen=count))


FOLLOW_CHUNK_BYTES = 256 * 1024


class LogFollower:
    """Reads what a worker writes after a point, a bounded chunk at a time.

    A follower that falls more than a chunk behind (the worker prints faster than anyone
    reads) skips ahead to the last chunk and counts the lines it skipped, so neither the agent
    nor the server holds more than a chunk for it.
    """

    def __init__(self, log: WorkerLog) -> None:
        self.log = log
        self.offset = log.size()

    def read(self) -> tuple[str, int]:
        """The new complete lines since the last read, and how many lines were skipped."""
        size = self.log.size()
        if size < self.offset:  # cut back (rotated): carry on from near its end
            self.offset = max(size - FOLLOW_CHUNK_BYTES, 0)
        if size == self.offset:
            return "", 0
        missed = 0
        try:
            with self.log.current.open("rb") as f:
                if size - self.offset > FOLLOW_CHUNK_BYTES:
                    skip_to = size - FOLLOW_CHUNK_BYTES
                    f.seek(self.offset)
                    while self.offset < skip_to:
                        block = f.read(min(1 << 20, skip_to - self.offset))
                        if not block:
                            break
                        missed += block.count(b"\n")
                        self.offset += len(block)
                f.seek(self.offset)
                data = f.read(size - self.offset)
        except OSError:
            return "", missed
        end = data.rfind(b"\n") + 1  # only whole lines; the rest comes with its newline
        self.offset += end
        return data[:end].decode(errors="replace"), missed

    def rest(self) -> str:
        """Whatever is left, a last line without its newline included (the worker ended)."""
        text, _ = self.read()
        size = self.log.size()
        if size > self.offset:
            with contextlib.suppress(OSError), self.log.current.open("rb") as f:
                f.seek(self.offset)
                tail = f.read(FOLLOW_CHUNK_BYTES)
                self.offset += len(tail)
                text += tail.decode(errors="replace") + "\n"
        return text
