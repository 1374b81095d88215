"""A followed log's chunks on their way to its reader: bounded, with the lines it drops
counted. The one buffer of every follow: the servicer's, of the lines this replica's machine
sends (backend/gateway/servicer.py), and the Redis router's, of the lines another replica
relays (backend/gateway/redis_router.py)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, replace

# Chunks (each at most 256 KiB) held for one follower that is behind: by the replica whose
# machine sends them, and again by a replica they are relayed to.
FOLLOW_BUFFER = 64


@dataclass(frozen=True)
class LogChunkInfo:
    """Lines of a followed log: ``missed`` lines were dropped before them; ``ended`` is last."""

    text: str
    archived: bool
    missed: int
    ended: bool


class FollowBuffer:
    """A follow's chunks not read yet, at most ``size``: the lines of chunks that do not fit
    are counted and reported as missed on the next chunk that does. The end always gets in:
    when there is no room for it, the newest chunk waiting makes room (its lines counted as
    missed), so every line is read or counted, and the gap is where the lines went missing.
    ``arrived`` is set by each chunk offered, and cleared by a ``take`` that finds none."""

    def __init__(self, size: int = FOLLOW_BUFFER) -> None:
        self.size = size
        self.chunks: deque[LogChunkInfo] = deque()
        self.missed = 0  # lines dropped since the last chunk that got in
        self.arrived = asyncio.Event()

    def offer(self, chunk: LogChunkInfo) -> None:
        if len(self.chunks) >= self.size:
            if not chunk.ended:
                self.missed += chunk.missed + chunk.text.count("\n")
                return
            dropped = self.chunks.pop()  # the end must arrive: the newest waiting makes room
            self.missed += dropped.missed + dropped.text.count("\n")
        self.chunks.append(replace(chunk, missed=chunk.missed + self.missed))
        self.missed = 0
        self.arrived.set()

    def take(self) -> LogChunkInfo | None:
        """The oldest chunk waiting; None when none is."""
        if self.chunks:
            return self.chunks.popleft()
        self.arrived.clear()
        return None
