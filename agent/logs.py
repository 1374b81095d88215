"""Workers' logs on the machine's disk: written as the worker prints, read on request.

Each worker has a folder with its current log; when its process is removed the last 1 000
lines are kept as the archived log, served until a new process of the same worker replaces
them. Logs are never sent anywhere unless asked.

Beside each log, ``.times`` says when its output arrived: one fixed-size record (byte offset,
Unix milliseconds) per write, so the time of any line is found by a binary search, and a tail
can show each line with its time (``docker logs -t`` style) without the text carrying it.
"""

from __future__ import annotations

import contextlib
import shutil
import struct
import time
from datetime import UTC, datetime
from pathlib import Path

ARCHIVED_LINES = 1000
SNAPSHOT_LINES = 50
SNAPSHOT_BYTES = 16 * 1024
MAX_LOG_BYTES = 64 * 2**20  # the current log is cut back to its last half past this
TIME = struct.Struct("<QQ")  # (byte offset where a write began, Unix milliseconds)
READ_BLOCK = 64 * 1024


class WorkerLog:
    def __init__(self, root: Path, key: str) -> None:
        """The log of the worker known on this machine as ``key`` (the server's id for it)."""
        self.folder = root / key
        self.current = self.folder / "current.log"
        self.archived = self.folder / "archived.log"

    def begin(self) -> None:
        """A new process of the worker: its log replaces what was shown before."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.current.write_bytes(b"")
        _times(self.current).write_bytes(b"")
        self.archived.unlink(missing_ok=True)
        _times(self.archived).unlink(missing_ok=True)

    def append(self, data: bytes, at_ms: int | None = None) -> None:
        """Add output that arrived at ``at_ms`` (now by default)."""
        if not data:
            return
        with self.current.open("ab") as f:
            offset = f.tell()
            f.write(data)
        with _times(self.current).open("ab") as f:
            f.write(TIME.pack(offset, at_ms if at_ms is not None else int(time.time() * 1000)))
        if offset + len(data) > MAX_LOG_BYTES:
            self._cut_back()

    def _cut_back(self) -> None:
        data = self.current.read_bytes()
        cut = len(data) // 2
        cut += data[cut:].find(b"\n") + 1
        self.current.write_bytes(data[cut:])
        _keep_times_from(_times(self.current), _times(self.current), cut)

    def size(self) -> int:
        """The current log's size in bytes (0 when there is none)."""
        try:
            return self.current.stat().st_size
        except OSError:
            return 0

    def tail(self, lines: int, *, timestamps: bool = False) -> tuple[str, bool]:
        """The last lines, and whether they come from a process that no longer exists; with
        ``timestamps``, each line begins with the time it arrived (RFC 3339, UTC, ms)."""
        for path, archived in ((self.current, False), (self.archived, True)):
            if path.exists():
                data, start = _last_lines_at(path, lines)
                if timestamps:
                    data = _stamped(data, start, _times(path))
                return data.decode(errors="replace"), archived
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
        """The process is gone: keep its last 1 000 lines (and when they arrived)."""
        if self.current.exists():
            data, start = _last_lines_at(self.current, ARCHIVED_LINES)
            self.archived.write_bytes(data)
            _keep_times_from(_times(self.current), _times(self.archived), start)
            self.current.unlink()
            _times(self.current).unlink(missing_ok=True)

    def delete(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _times(log: Path) -> Path:
    return log.with_suffix(".times")


def _last_lines_at(path: Path, count: int) -> tuple[bytes, int]:
    """The last ``count`` lines of a file and the byte offset they start at, read from its
    end a block at a time (a tail of a 64 MiB log reads kilobytes, not the whole log)."""
    with path.open("rb") as f:
        end = f.seek(0, 2)
        position, data, newlines = end, b"", 0
        while position > 0 and newlines <= count:
            step = min(READ_BLOCK, position)
            position -= step
            f.seek(position)
            block = f.read(step)
            newlines += block.count(b"\n")
            data = block + data
    # Past the first block read, the first piece may be part of a line: never kept, as more
    # than ``count`` newlines were read.
    pieces = data.splitlines(keepends=True)
    kept = pieces[-count:] if count else []
    size = sum(len(p) for p in kept)
    return b"".join(kept), end - size


def _last_lines(path: Path, count: int) -> str:
    return _last_lines_at(path, count)[0].decode(errors="replace")


def _time_records(times: Path, start: int = 0) -> list[tuple[int, int]]:
    """The records from the last one at or before byte ``start`` on (found by bisection)."""
    try:
        f = times.open("rb")
    except OSError:
        return []
    with f:
        count = f.seek(0, 2) // TIME.size
        low, high = 0, count  # the first record past ``start`` is in [low, high]
        while low < high:
            middle = (low + high) // 2
            f.seek(middle * TIME.size)
            offset, _ = TIME.unpack(f.read(TIME.size))
            if offset <= start:
                low = middle + 1
            else:
                high = middle
        f.seek(max(low - 1, 0) * TIME.size)
        raw = f.read((count - max(low - 1, 0)) * TIME.size)
    return [TIME.unpack_from(raw, i) for i in range(0, len(raw), TIME.size)]


def _keep_times_from(source: Path, target: Path, start: int) -> None:
    """The records of the bytes from ``start`` on, renumbered from 0 (a cut or an archive)."""
    records = _time_records(source)
    kept: list[tuple[int, int]] = []
    for offset, ms in records:
        if offset <= start:
            kept = [(0, ms)]  # the write the kept text begins in
        else:
            kept.append((offset - start, ms))
    target.write_bytes(b"".join(TIME.pack(o, ms) for o, ms in kept))


def _stamped(data: bytes, start: int, times: Path) -> bytes:
    """Each line prefixed with the time its write arrived."""
    records = _time_records(times, start)
    out, offset, i = [], start, 0
    for line in data.splitlines(keepends=True):
        while i + 1 < len(records) and records[i + 1][0] <= offset:
            i += 1
        ms = records[i][1] if records and records[i][0] <= offset else None
        out.append((_rfc3339(ms) + " " if ms is not None else "").encode() + line)
        offset += len(line)
    return b"".join(out)


def _rfc3339(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


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
