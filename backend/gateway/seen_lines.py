"""The last lines of each worker this replica relayed from its machine (a tail asked for, a
follow), kept for a failure snapshot should the machine be lost (issue 36): its agent's own
copies go with it. At most 50 lines and 16 KiB a worker (seed L-21), in memory while its
machine's stream is held here; the lease keeper writes what changed every few seconds
(backend/gateway/leases.py), and the lifecycle takes them into the snapshots of a lost
machine's workers. Lines of an archived log (an earlier attempt's) are not its current
attempt's: they are left out."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

# What a failure snapshot keeps (seed L-21): its last 50 lines, at most 16 KiB.
SEEN_LINES = 50
SEEN_BYTES = 16 * 1024
# The workers of one machine whose lines are kept, the latest relayed.
SEEN_WORKERS = 64


@dataclass(frozen=True)
class Seen:
    """A worker's last lines seen on its machine, and when they were."""

    machine_id: int
    worker_id: int
    text: str
    at: datetime


@dataclass
class _Tail:
    lines: deque[str] = field(default_factory=deque)
    size: int = 0
    at: datetime | None = None

    def add(self, text: str) -> None:
        for line in text.splitlines(keepends=True):
            data = line.encode()
            if len(data) > SEEN_BYTES:  # a line over the bound keeps its end
                line = data[-SEEN_BYTES:].decode(errors="ignore")
            self.lines.append(line)
            self.size += len(line.encode())
        while len(self.lines) > SEEN_LINES or (self.size > SEEN_BYTES and len(self.lines) > 1):
            self.size -= len(self.lines.popleft().encode())


class SeenLines:
    """The lines relayed per machine and worker; which changed since they were last taken. A
    machine's stream may last for weeks: the workers whose lines were relayed last are kept,
    SEEN_WORKERS of each machine at most (it runs a few at a time)."""

    def __init__(self) -> None:
        self._tails: dict[int, dict[int, _Tail]] = {}  # by machine, then worker, oldest first
        self._changed: set[tuple[int, int]] = set()
        self._closed: set[int] = set()

    def tail(self, machine_id: int, worker_id: int, text: str, at: datetime) -> None:
        """A tail of the worker's log: its last lines now (those before it are not its last)."""
        self._tails.get(machine_id, {}).pop(worker_id, None)
        self.follow(machine_id, worker_id, text, at)

    def follow(self, machine_id: int, worker_id: int, text: str, at: datetime) -> None:
        """New lines of a followed log, after those seen before."""
        if not text:
            return
        workers = self._tails.setdefault(machine_id, {})
        tail = workers.pop(worker_id, None) or _Tail()
        workers[worker_id] = tail  # the latest relayed, last
        tail.add(text)
        tail.at = at
        self._changed.add((machine_id, worker_id))
        while len(workers) > SEEN_WORKERS:
            oldest = next(iter(workers))
            del workers[oldest]
            self._changed.discard((machine_id, oldest))

    def opened(self, machine_id: int) -> None:
        """The machine's stream is held here (again)."""
        self._closed.discard(machine_id)

    def closed(self, machine_id: int) -> None:
        """Its stream ended: its lines are forgotten once taken."""
        self._closed.add(machine_id)

    def take(self) -> list[Seen]:
        """What changed since the last take; the workers of closed streams are let go."""
        taken = []
        for m, w in sorted(self._changed):
            tail = self._tails[m][w]
            assert tail.at is not None
            taken.append(Seen(m, w, "".join(tail.lines), tail.at))
        self._changed.clear()
        for machine_id in self._closed & set(self._tails):
            del self._tails[machine_id]
        return taken

    def untaken(self, seen: list[Seen]) -> None:
        """What was taken could not be written: it is taken again next time (unless newer
        lines came meanwhile)."""
        for s in seen:
            if s.worker_id not in self._tails.get(s.machine_id, {}):
                self.follow(s.machine_id, s.worker_id, s.text, s.at)
            self._changed.add((s.machine_id, s.worker_id))
