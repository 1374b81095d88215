"""Log requests taken to the API replica that holds the machine's stream.

A machine's agent keeps one stream open, to one replica. A log tail or follow asked of any
replica is answered by that one: directly when it is this process (always so in the embedded
mode: ``LocalRouter``), otherwise through Redis (``RedisRouter``,
backend/gateway/redis_router.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from backend.config import Settings
from backend.gateway import redis_router
from backend.gateway.follow_buffer import LogChunkInfo
from backend.gateway.servicer import AgentService
from backend.logs.service import LogText, WorkerRef


class LogRouter(Protocol):
    """Asks whichever replica holds a machine's stream for a worker's log."""

    def stream_changed(self, machine_id: int, held: bool) -> None:
        """This process opened (``held``) or closed the machine's stream."""

    def serving(self, local: AgentService) -> contextlib.AbstractAsyncContextManager[None]:
        """Answer for the machines whose stream ``local`` holds, while inside."""

    async def tail(
        self, machine_id: int, worker: WorkerRef, lines: int, max_bytes: int, wait_s: float
    ) -> LogText | None:
        """The worker's last lines, or None when no replica's machine answers within wait_s."""

    def follow(
        self, machine_id: int, worker: WorkerRef, tail_lines: int = 0
    ) -> AsyncGenerator[LogChunkInfo, None]:
        """As ``AgentService.follow``, from whichever replica holds the stream; closing it
        (``contextlib.aclosing``) tells the machine to stop."""


def for_settings(settings: Settings) -> LogRouter:
    if settings.broker == "redis":
        return redis_router.RedisRouter(settings.redis_url, prefix=redis_router.PREFIX)
    return LocalRouter()


class LocalRouter:
    """The embedded mode: this process holds every stream there is."""

    def __init__(self) -> None:
        self.local: AgentService | None = None

    def stream_changed(self, machine_id: int, held: bool) -> None:
        pass

    @contextlib.asynccontextmanager
    async def serving(self, local: AgentService) -> AsyncIterator[None]:
        self.local = local
        try:
            yield
        finally:
            self.local = None

    async def tail(
        self, machine_id: int, worker: WorkerRef, lines: int, max_bytes: int, wait_s: float
    ) -> LogText | None:
        if self.local is None:
            return None
        return await self.local.tail(machine_id, worker, lines, max_bytes, wait_s)

    async def follow(
        self, machine_id: int, worker: WorkerRef, tail_lines: int = 0
    ) -> AsyncGenerator[LogChunkInfo, None]:
        if self.local is None:
            return
        async with contextlib.aclosing(self.local.follow(machine_id, worker, tail_lines)) as chunks:
            async for chunk in chunks:
                yield chunk
