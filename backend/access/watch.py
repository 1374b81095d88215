"""Open streams end when their token does: one look at the tokens every few seconds per
process, for every subscription and WebSocket in it.

A token is checked when a request or a WebSocket begins; a subscription may stream for hours
after. While any stream is open, the watch reads every ``LOOK_SECONDS`` which of their tokens
were revoked or have expired (one statement for all of them), ends those subscriptions with the
reason, and closes those WebSockets (4403, the code a refused connection_init gets)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.websockets import WebSocket, WebSocketState

from backend.access import repository
from backend.access.rules import REVOKED, token_refusal
from backend.clock import Clock
from backend.db import Database

log = logging.getLogger(__name__)

LOOK_SECONDS = 2.0
# WebSocket close code for a token refused while the connection is open (graphql-transport-ws
# uses 4403 for a refused connection_init).
CLOSE_CODE = 4403


@dataclass(eq=False)
class Stream:
    """One open subscription (or WebSocket) and why its token is refused, once it is."""

    token_id: int
    websocket: WebSocket | None = None
    refused: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""


class TokenWatch:
    def __init__(self, db: Database, clock: Clock, look_seconds: float = LOOK_SECONDS) -> None:
        self.db = db
        self.clock = clock
        self.look_seconds = look_seconds
        self.looks = 0  # reads of the tokens so far (the tests count them)
        self._streams: set[Stream] = set()
        self._task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def watching(self, token_id: int) -> AsyncIterator[Stream]:
        """While inside, ``stream.refused`` is set once the token is revoked or expires."""
        stream = Stream(token_id)
        self._add(stream)
        try:
            yield stream
        finally:
            self._streams.discard(stream)

    def watch_websocket(self, token_id: int, websocket: WebSocket) -> None:
        """Close ``websocket`` once its token is refused; forgotten once it is closed."""
        self._add(Stream(token_id, websocket))

    def _add(self, stream: Stream) -> None:
        self._streams.add(stream)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._look())

    async def _look(self) -> None:
        while self._streams:
            await asyncio.sleep(self.look_seconds)
            self._streams -= {s for s in self._streams if _closed(s)}
            if not self._streams:
                break
            try:
                refused = await self._refused({s.token_id for s in self._streams})
            except Exception as error:  # the database away: look again later
                log.warning("the token watch could not read the tokens: %s", error)
                continue
            ended = [s for s in self._streams if s.token_id in refused]
            self._streams -= set(ended)
            if ended:
                await _end(ended, refused)

    async def _refused(self, token_ids: set[int]) -> dict[int, str]:
        now = self.clock.now()
        async with self.db.read() as session:
            states = await repository.token_states(session, token_ids)
        self.looks += 1
        refused: dict[int, str] = {}
        for token_id in token_ids:
            if token_id not in states:
                refused[token_id] = REVOKED
                continue
            reason = token_refusal(*states[token_id], now)
            if reason is not None:
                refused[token_id] = reason
        return refused


def _closed(stream: Stream) -> bool:
    socket = stream.websocket
    return socket is not None and WebSocketState.DISCONNECTED in (
        socket.client_state,
        socket.application_state,
    )


async def _end(streams: list[Stream], reasons: dict[int, str]) -> None:
    for stream in streams:
        stream.reason = reasons[stream.token_id]
        stream.refused.set()
    sockets = [s for s in streams if s.websocket is not None]
    if not sockets:
        return
    # the subscriptions on them first say why they end, then the connections close
    await asyncio.sleep(0.2)
    for stream in sockets:
        assert stream.websocket is not None
        with contextlib.suppress(Exception):  # closed meanwhile by the client
            await stream.websocket.close(code=CLOSE_CODE, reason=stream.reason[:120])


_WATCHES: weakref.WeakKeyDictionary[AsyncEngine, TokenWatch] = weakref.WeakKeyDictionary()


def watch_of(db: Database, clock: Clock) -> TokenWatch:
    """The token watch of this process's database (one per engine: a request's ``db`` may be a
    view of it that shares it)."""
    watch = _WATCHES.get(db.engine)
    if watch is None:
        watch = _WATCHES[db.engine] = TokenWatch(Database(db.engine), clock)
    return watch
