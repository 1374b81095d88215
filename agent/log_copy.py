"""A Slurm worker's log, copied as it grows into the agent's own log of it (agent/logs.py).

A job's task keeps its log where it runs (agent.slurm_task writes it in the run's folder, as the
agent writes its own workers' logs; an imported job's output is the file Slurm writes). The agent
copies it into its log folder, keyed by the server's id for the worker, so tails, follows, the
archive kept after the end and the progress its output shows all work as for its own workers,
and nothing the job's user controls is read by path again once opened.

The copy keeps each write's time where the source says it (the ``.times`` records beside an
agent.slurm_task log), else the time of the source's last write (its mtime) when it was copied
(a look every fraction of a second).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from agent import confined
from agent.logs import TIME, WorkerLog

COPY_BYTES = 4 * 2**20  # copied in one look at most (the rest at the next)
READ_BYTES = 2**20
CUT_BACK = (
    b"[the log on the node was cut back or begun again: lines written meanwhile may be "
    b"missing here]\n"
)

Opener = Callable[[], int]


class LogCopy:
    """Copies ``open_log``'s file (and its time records, ``open_times``) into ``log``."""

    def __init__(self, log: WorkerLog, open_log: Opener, open_times: Opener | None = None) -> None:
        self.log = log
        self.open_log = open_log
        self.open_times = open_times
        self.fd: int | None = None
        self.times_fd: int | None = None
        self.offset = 0  # of the source, copied up to here
        self.times_offset = 0  # of the time records, read up to here
        self.ms: int | None = None  # the time of the last write that began at or before offset
        self.pending: list[tuple[int, int]] = []  # records of writes beyond offset

    def copy(self) -> int:
        """Copy what was written since the last copy; how many bytes."""
        if self.fd is None:
            try:
                self.fd = self.open_log()
            except OSError:
                return 0  # not there yet (its task starts), or not a file it may read
            if self.open_times is not None:
                try:
                    self.times_fd = self.open_times()
                except OSError:
                    self.times_fd = None
        self._read_times()
        status = os.fstat(self.fd)
        size = status.st_size
        if self.times_fd is None:
            # no time records (a batch script's output): what is copied now was written by its
            # last write, the file's mtime, not when it was copied (its first copy, when the
            # watch begins, may be seconds after a job's last line: a stall is dated from it)
            self.ms = min(status.st_mtime_ns // 1_000_000, int(time.time() * 1000))
        if size < self.offset:
            self._lost_track(size)
            return 0
        copied = 0
        while self.offset < size and copied < COPY_BYTES:
            data = os.pread(self.fd, min(READ_BYTES, size - self.offset), self.offset)
            if not data:
                break
            for at, piece in self._timed(data):
                self.log.append(piece, at)
            self.offset += len(data)
            copied += len(data)
        return copied

    def close(self) -> None:
        confined.close(self.fd)
        confined.close(self.times_fd)
        self.fd = self.times_fd = None

    def _read_times(self) -> None:
        if self.times_fd is None:
            return
        size = os.fstat(self.times_fd).st_size
        if size < self.times_offset:  # rewritten with the log (cut back): read again whole
            self.times_offset, self.pending = 0, []
        whole = (size - self.times_offset) // TIME.size * TIME.size
        if whole <= 0:
            return
        raw = os.pread(self.times_fd, whole, self.times_offset)
        self.times_offset += len(raw)
        for i in range(0, len(raw) - len(raw) % TIME.size, TIME.size):
            offset, ms = TIME.unpack_from(raw, i)
            if offset <= self.offset:
                self.ms = ms
            else:
                self.pending.append((offset, ms))

    def _timed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The data (from ``offset``) in pieces, each with the time of the write it is of."""
        out: list[tuple[int, bytes]] = []
        start, end = self.offset, self.offset + len(data)
        while self.pending and self.pending[0][0] < end:
            at, ms = self.pending.pop(0)
            if at > start:
                out.append((self._now_or_ms(), data[start - self.offset : at - self.offset]))
                start = at
            self.ms = ms
        out.append((self._now_or_ms(), data[start - self.offset :]))
        return out

    def _now_or_ms(self) -> int:
        return self.ms if self.ms is not None else int(time.time() * 1000)

    def _lost_track(self, size: int) -> None:
        """The source shrank: cut back past its cap, or begun anew. Copying goes on from its
        end, after a line that says some lines may be missing."""
        self.log.append(CUT_BACK)
        self.offset, self.ms, self.pending = size, None, []
        self.times_offset = 0
        self._read_times()
