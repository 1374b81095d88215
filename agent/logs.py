"""Workers' logs on the machine's disk: written as the worker prints, read on request.

Each worker has a folder with its current log; when its process is removed the last 1 000
lines are kept as the archived log, served until a new process of the same worker replaces
them. Logs are never sent anywhere unless asked.

Beside each log, ``.times`` says when its output arrived: one fixed-size record (byte offset,
Unix milliseconds) per write in a new millisecond, written before the write's text, so the time
of any line is found by a binary search, and a tail can show each line with its time (``docker
logs -t`` style) without the text carrying it.

Every read is bounded, so that one workload cannot stall the machine: a line is cut at 64 KiB
with a marker as it is written; a tail reads at most 1 MiB from the file's end, backwards a
block at a time (a log of one 62 MiB line is never read whole); an archive keeps at most
1 000 lines and 1 MiB and says what it left out. The agent calls these off its event loop.
"""

from __future__ import annotations

import contextlib
import shutil
import struct
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

ARCHIVED_LINES = 1000
ARCHIVED_BYTES = 2**20
SNAPSHOT_LINES = 50
SNAPSHOT_BYTES = 16 * 1024
MAX_LOG_BYTES = 64 * 2**20  # the current log is cut back to its last half past this
TIME = struct.Struct("<QQ")  # (byte offset where a write began, Unix milliseconds)
READ_BLOCK = 64 * 1024
LINE_BYTES = 64 * 1024  # a line is kept to this many bytes, then the marker
LINE_CUT = b" [line cut: a log line is kept to 64 KiB]"
TAIL_BYTES = 2**20  # a tail reads at most this much of a log's end
EARLIER_CUT = "[earlier output not kept: {size} (an archived log keeps its last 1 MiB)]\n"


class WorkerLog:
    def __init__(self, root: Path, key: str) -> None:
        """The log of the worker known on this machine as ``key`` (the server's id for it)."""
        self.folder = root / key
        self.current = self.folder / "current.log"
        self.archived = self.folder / "archived.log"
        self.line: LineCutter | None = None  # the writer's; read from the file's end at first
        self.last_ms: int | None = None  # of the last time record written

    def begin(self) -> None:
        """A new process of the worker: its log replaces what was shown before."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.current.write_bytes(b"")
        _times(self.current).write_bytes(b"")
        self.archived.unlink(missing_ok=True)
        _times(self.archived).unlink(missing_ok=True)
        self.line, self.last_ms = LineCutter(), None

    def append(self, data: bytes, at_ms: int | None = None) -> None:
        """Add output that arrived at ``at_ms`` (now by default), each line cut at 64 KiB."""
        if self.line is None:
            self.line = LineCutter.after(self.current)
        data = self.line.cut(data)
        if not data:
            return
        ms = at_ms if at_ms is not None else int(time.time() * 1000)
        with self.current.open("ab") as f:
            offset = f.tell()
            if ms != self.last_ms:  # writes in one millisecond share its record
                # the time before the text: a reader in another process (the agent's sampler,
                # a follow) that sees the text finds its time, never the write before's
                with _times(self.current).open("ab") as times:
                    times.write(TIME.pack(offset, ms))
                self.last_ms = ms
            f.write(data)
        if offset + len(data) > MAX_LOG_BYTES:
            self._cut_back()

    def _cut_back(self) -> None:
        """Keep the log's last half (from a line's start), moved a block at a time."""
        with self.current.open("r+b") as f:
            size = f.seek(0, 2)
            cut = _next_line_start(f, size // 2, size)
            written = 0
            while block := _read_at(f, cut + written, 1 << 20):
                f.seek(written)
                f.write(block)
                written += len(block)
            f.truncate(written)
        _keep_times_from(_times(self.current), _times(self.current), cut)

    def size(self) -> int:
        """The current log's size in bytes (0 when there is none)."""
        try:
            return self.current.stat().st_size
        except OSError:
            return 0

    def last_written_ms(self) -> int | None:
        """When the current log was last written (Unix ms), from its last time record: the
        writer may be another process (the worker's shim). None when nothing was written."""
        try:
            with _times(self.current).open("rb") as f:
                end = f.seek(0, 2)
                if end < TIME.size:
                    return None
                f.seek(end - end % TIME.size - TIME.size)
                return int(TIME.unpack(f.read(TIME.size))[1])
        except OSError:
            return None

    def tail(self, lines: int, *, timestamps: bool = False) -> tuple[str, bool]:
        """The last lines (of at most the log's last 1 MiB), and whether they come from a
        process that no longer exists; with ``timestamps``, each line begins with the time it
        arrived (RFC 3339, UTC, ms)."""
        for path, archived in ((self.current, False), (self.archived, True)):
            if path.exists():
                data, start = _last_lines_at(path, lines, TAIL_BYTES)
                if timestamps:
                    data = _stamped(data, start, _times(path))
                return data.decode(errors="replace"), archived
        return "", False

    def tail_to_follow(self, lines: int) -> tuple[str, bool, int]:
        """What a follow starts with: the last complete lines, as ``tail`` gives them, whether
        they are archived, and the byte offset of the current log just after them, where the
        follower goes on (``LogFollower(log, offset)``). Taken in one read, so a line written
        in between is neither lost nor sent twice, and a line still being written comes whole
        with the follower's first read."""
        for path, archived in ((self.current, False), (self.archived, True)):
            if path.exists():
                data, start = _last_lines_at(path, lines, TAIL_BYTES, complete=not archived)
                return data.decode(errors="replace"), archived, start + len(data)
        return "", False, 0

    def snapshot(self) -> str:
        """The failure snapshot's output: the last 50 lines, at most 16 KiB (of the archived
        log once the process is gone)."""
        path = self.current if self.current.exists() else self.archived
        text = _last_lines(path, SNAPSHOT_LINES, SNAPSHOT_BYTES) if path.exists() else ""
        data = text.encode()
        if len(data) > SNAPSHOT_BYTES:
            data = data[-SNAPSHOT_BYTES:]
            text = data.decode(errors="ignore")
        return text

    def archive(self) -> None:
        """The process is gone: keep its last 1 000 lines, at most 1 MiB (and when they
        arrived); a first line says how many bytes before them the byte bound left out."""
        if self.current.exists():
            data, start = _last_lines_at(self.current, ARCHIVED_LINES, ARCHIVED_BYTES)
            marker = b""
            if start > 0 and len(data.splitlines()) < ARCHIVED_LINES:  # the byte bound cut
                marker = EARLIER_CUT.format(size=_size(start)).encode()
            self.archived.write_bytes(marker + data)
            _keep_times_from(_times(self.current), _times(self.archived), start, len(marker))
            self.current.unlink()
            _times(self.current).unlink(missing_ok=True)

    def delete(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _times(log: Path) -> Path:
    return log.with_suffix(".times")


class LineCutter:
    """Cuts each line a writer gives at ``LINE_BYTES``, with ``LINE_CUT`` after the kept part;
    the rest of the line, up to its newline, is dropped (however many writes it spans)."""

    def __init__(self, length: int = 0, cutting: bool = False) -> None:
        self.length = length  # bytes of the unfinished last line kept so far
        self.cutting = cutting  # that line was cut: drop until its newline

    @classmethod
    def after(cls, log: Path) -> LineCutter:
        """Carry on the log's unfinished last line (the writer may be a new process)."""
        try:
            with log.open("rb") as f:
                size = f.seek(0, 2)
                end = _read_at(f, max(size - LINE_BYTES - len(LINE_CUT), 0), size)
        except OSError:
            return cls()
        if end.endswith(LINE_CUT):
            return cls(LINE_BYTES, cutting=True)
        newline = end.rfind(b"\n")
        if newline < 0 and len(end) < size:  # a line longer than any this writer keeps
            return cls(LINE_BYTES)
        return cls(len(end) - newline - 1)

    def cut(self, data: bytes) -> bytes:
        """What of ``data`` is kept: linear in its length."""
        out: list[bytes] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            if not self.cutting:
                room = max(LINE_BYTES - self.length, 0)
                if end - start <= room:
                    out.append(data[start:end])
                    self.length += end - start
                else:
                    kept = _whole_characters(data[start : start + room])
                    out += [kept, LINE_CUT]
                    self.length += len(kept)
                    self.cutting = True
            if newline < 0:
                break
            out.append(b"\n")
            self.length, self.cutting = 0, False
            start = newline + 1
        return b"".join(out)


def _whole_characters(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut at its end (at most 3 bytes shorter)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # a character's first byte: whole when its length fits
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if length <= back else data[:-back]
    return data


def _read_at(f: BinaryIO, position: int, size: int) -> bytes:
    f.seek(position)
    return f.read(size)


def _size(size: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _next_line_start(f: BinaryIO, position: int, end: int) -> int:
    """The first line start at or after ``position`` (``end`` when none), read forwards."""
    if position == 0:
        return 0
    while position < end:
        block = _read_at(f, position - 1, READ_BLOCK + 1)
        newline = block.find(b"\n")
        if newline >= 0:
            return position + newline
        position += len(block) - 1
    return end


def _last_lines_at(
    path: Path, count: int, limit: int, *, complete: bool = False
) -> tuple[bytes, int]:
    """The last ``count`` lines of a file within its last ``limit`` bytes, and the byte offset
    they start at: read from the end a block at a time, so linear in what is read (a tail of a
    64 MiB log reads at most ``limit``, never the whole log). With ``complete``, a last line
    without its newline (still being written) is left out."""
    with path.open("rb") as f:
        end = f.seek(0, 2)
        position, blocks, newlines = end, [], 0
        while position > 0 and newlines <= count and end - position < limit:
            step = min(READ_BLOCK, position, limit - (end - position))
            position -= step
            block = _read_at(f, position, step)
            newlines += block.count(b"\n")
            blocks.append(block)
        whole = position == 0 or _read_at(f, position - 1, 1) == b"\n"
    pieces = b"".join(reversed(blocks)).splitlines(keepends=True)
    if not whole and pieces:
        pieces = pieces[1:]  # part of a line that began before what was read: never shown
    partial = 0
    if complete and pieces and not pieces[-1].endswith(b"\n"):
        partial = len(pieces.pop())
    kept = pieces[-count:] if count else []
    size = sum(len(p) for p in kept)
    return b"".join(kept), end - partial - size


def _last_lines(path: Path, count: int, limit: int) -> str:
    return _last_lines_at(path, count, limit)[0].decode(errors="replace")


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


def _keep_times_from(source: Path, target: Path, start: int, shift: int = 0) -> None:
    """The records of the bytes from ``start`` on, renumbered from ``shift`` (a cut, or an
    archive that begins with a marker of ``shift`` bytes)."""
    records = _time_records(source, start)
    kept: list[tuple[int, int]] = []
    for offset, ms in records:
        if offset <= start:
            kept = [(0, ms)]  # the write the kept text begins in (and the marker)
        else:
            kept.append((offset - start + shift, ms))
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

    def __init__(self, log: WorkerLog, offset: int | None = None) -> None:
        """From ``offset`` of the current log (a tail's end: ``tail_to_follow``), else from
        its end now."""
        self.log = log
        self.offset = log.size() if offset is None else offset

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
