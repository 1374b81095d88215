"""The last lines of each worker this replica relayed from its machine (a tail asked for, a
follow), kept for a failure snapshot should the machine be lost (issue 36): its agent's own
copies go with it. At most 50 lines and 16 KiB a worker (seed L-21), in memory while its
machine's stream is held here; the lease keeper writes what changed every few seconds
(backend/agents/leases.py), and the lifecycle takes them into the snapshots of a lost
machine's workers. Lines of an archived log (an earlier attempt's) are not its current
attempt's: they are left out."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

# What a failure snapshot keeps (seed L-21): its last 50 lines, at most 16 KiB.
SEEN_LINES = 50
SEEN_BYTES = 16 * 1024


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
    """The lines relayed per machine and worker; which changed since they were last taken."""

    def __init__(self) -> None:
        self._tails: dict[tuple[int, int], _Tail] = {}
        self._changed: set[tuple[int, int]] = set()
        self._closed: set[int] = set()

    def tail(self, machine_id: int, worker_id: int, text: str, at: datetime) -> None:
        """A tail of the worker's log: its last lines now (those before it are not its last)."""
        self._tails[(machine_id, worker_id)] = _Tail()
        self.follow(machine_id, worker_id, text, at)

    def follow(self, machine_id: int, worker_id: int, text: str, at: datetime) -> None:
        """New lines of a followed log, after those seen before."""
        if not text:
            return
        key = (machine_id, worker_id)
        tail = self._tails.setdefault(key, _Tail())
        tail.add(text)
        tail.at = at
        self._changed.add(key)

    def opened(self, machine_id: int) -> None:
        """The machine's stream is held here (again)."""
        self._closed.discard(machine_id)

    def closed(self, machine_id: int) -> None:
        """Its stream ended: its lines are forgotten once taken."""
        self._closed.add(machine_id)

    def take(self) -> list[Seen]:
        """What changed since the last take; the workers of closed streams are let go."""
        taken = [
            Seen(m, w, "".join(tail.lines), tail.at)
            for (m, w) in sorted(self._changed)
            if (tail := self._tails[(m, w)]).at is not None
        ]
        self._changed.clear()
        for key in [k for k in self._tails if k[0] in self._closed]:
            del self._tails[key]
        return taken

    def untaken(self, seen: list[Seen]) -> None:
        """What was taken could not be written: it is taken again next time (unless newer
        lines came meanwhile)."""
        for s in seen:
            key = (s.machine_id, s.worker_id)
            if key not in self._tails:
                tail = self._tails[key] = _Tail()
                tail.add(s.text)
                tail.at = s.at
            self._changed.add(key)
