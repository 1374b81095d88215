"""A followed log's chunks on their way to a reader: the lines a machine sends for one follow,
held, bounded, until the reader takes them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from astraeus.agent.v1 import agent_pb2

FOLLOW_BUFFER = 64  # chunks (each at most 256 KiB) held for one follower


@dataclass(frozen=True)
class LogChunkInfo:
    """Lines of a followed log: ``missed`` lines were dropped before them; ``ended`` is last."""

    text: str
    archived: bool
    missed: int
    ended: bool


@dataclass
class Follow:
    """One follower's chunks, bounded: what it cannot take in time is counted as missed."""

    chunks: asyncio.Queue[agent_pb2.LogChunk] = field(
        default_factory=lambda: asyncio.Queue(FOLLOW_BUFFER)
    )
    missed: int = 0

    def offer(self, chunk: agent_pb2.LogChunk) -> None:
        if self.missed:
            chunk.missed_lines += self.missed
        try:
            self.chunks.put_nowait(chunk)
            self.missed = 0
        except asyncio.QueueFull:
            self.missed = chunk.missed_lines + chunk.text.count("\n")
            if chunk.ended:  # the end must arrive: make room for it, counting what goes
                dropped = self.chunks.get_nowait()
                self.missed += dropped.missed_lines + dropped.text.count("\n")
                self.chunks.put_nowait(
                    agent_pb2.LogChunk(
                        worker_id=chunk.worker_id, ended=True, missed_lines=self.missed
                    )
                )
