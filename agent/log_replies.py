"""The agent's answers to the server's log requests: a worker's last lines (a tail), and its
new lines as they are written (a follow), read from the log kept on this machine (agent/logs.py).

A follow reads when its worker's log is written, woken by the agent's one watcher of followed
logs (agent/log_watch.py), and on its own every FOLLOW_FALLBACK_S, should no event come."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from astraeus.agent.v1 import agent_pb2

from agent.log_watch import LogWatch
from agent.logs import LogFollower, WorkerLog
from agent.state import Background, Outgoing

# A follow looks at its log this often without being woken (a filesystem without inotify, a
# watcher that could not start): the longest its lines then wait.
FOLLOW_FALLBACK_S = 1.0
# A follower waits while this many messages are queued for the server (it skips ahead later),
# looking again every QUEUE_RETRY_S: the queue drains without anything being written.
QUEUE_HIGH_WATER = 256
QUEUE_RETRY_S = 0.2


class Followed(Protocol):
    """A worker whose log is followed: the follow ends as it does."""

    @property
    def exited(self) -> asyncio.Event: ...


class LogReplies:
    """The agent's log replies, from the logs under ``log_root``; ``find`` gives the worker
    (its own or watched) of an id, to follow its log until it ends."""

    def __init__(
        self,
        log_root: Path,
        outgoing: Outgoing,
        background: Background,
        find: Callable[[int], Followed | None],
    ) -> None:
        self.log_root = log_root
        self.outgoing = outgoing
        self.background = background
        self.find = find
        self.follows: dict[str, asyncio.Task[None]] = {}
        self.log_watch = LogWatch(log_root)  # wakes follows as their logs are written

    def tail(self, request_id: int, request: agent_pb2.LogTailRequest) -> None:
        """Answered in a task of its own: the stream's messages go on meanwhile."""
        self.background.keep(asyncio.create_task(self._reply_tail(request_id, request)))

    def follow(self, request_id: int, request: agent_pb2.LogFollowStart) -> None:
        follow_id = request.follow_id or str(request_id)
        task = asyncio.create_task(
            self._stream_log(request_id, request), name=f"follow:{request.worker_id}"
        )
        self.follows[follow_id] = task
        task.add_done_callback(lambda _: self.follows.pop(follow_id, None))

    def stop(self, follow_id: str) -> None:
        follow = self.follows.pop(follow_id, None)
        if follow is not None:
            follow.cancel()

    def stop_all(self) -> None:
        """The server that asked is gone with its stream."""
        for follow in list(self.follows.values()):
            follow.cancel()

    async def drained(self, worker_id: int, seconds: float) -> None:
        """The worker's follows read to its log's end (it has ended), for ``seconds`` at most
        each, before its log is archived."""
        mine = f"follow:{worker_id}"
        for follow in [t for t in self.follows.values() if t.get_name() == mine]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(follow), seconds)

    def _reply(self, request_id: int, chunk: agent_pb2.LogChunk) -> None:
        # A reply needs no resending: the server waits for it only so long.
        self.outgoing.send(durable=False, reply=agent_pb2.Reply(request_id=request_id, log=chunk))

    async def _reply_tail(self, request_id: int, request: agent_pb2.LogTailRequest) -> None:
        """The last lines of a worker's log, cut to the bytes asked for (its end). Read in a
        thread: the stream's heartbeats and commands go on meanwhile."""
        text, archived = await asyncio.to_thread(
            WorkerLog(self.log_root, str(request.worker_id)).tail,
            request.lines or 1000,
            timestamps=request.timestamps,
        )
        data = text.encode()
        if request.max_bytes and len(data) > request.max_bytes:
            text = data[-request.max_bytes :].decode(errors="ignore")
        self._reply(
            request_id,
            agent_pb2.LogChunk(worker_id=request.worker_id, text=text, archived=archived),
        )

    def _follow(self, request_id: int, request: agent_pb2.LogFollowStart) -> None:
        follow_id = request.follow_id or str(request_id)
        task = asyncio.create_task(
            self._stream_log(request_id, request), name=f"follow:{request.worker_id}"
        )
        self.follows[follow_id] = task
        task.add_done_callback(lambda _: self.follows.pop(follow_id, None))

    async def _stream_log(self, request_id: int, request: agent_pb2.LogFollowStart) -> None:
        """Send the worker's new lines as they are written, until it ends or the server stops."""
        key = request.worker_id
        worker = self.find(key)
        wlog = WorkerLog(self.log_root, str(key))
        offset: int | None = None  # where the follower begins: after the tail, else the end
        if request.tail_lines:
            text, archived, end = await asyncio.to_thread(wlog.tail_to_follow, request.tail_lines)
            if not archived:
                offset = end
            if text:
                self._reply(
                    request_id, agent_pb2.LogChunk(worker_id=key, text=text, archived=archived)
                )
        if worker is None or worker.exited.is_set():
            self._reply(request_id, agent_pb2.LogChunk(worker_id=key, ended=True))
            return
        follower = LogFollower(wlog, offset)
        missed = 0
        with self.log_watch.following(wlog.folder) as written:
            while not worker.exited.is_set():
                if self.outgoing.queue.qsize() >= QUEUE_HIGH_WATER:
                    await _until(QUEUE_RETRY_S, worker.exited)
                    continue
                written.clear()  # a write from now on wakes the wait below
                text, skipped = await asyncio.to_thread(follower.read)
                missed += skipped
                if text or missed:
                    self._reply(
                        request_id,
                        agent_pb2.LogChunk(worker_id=key, text=text, missed_lines=missed),
                    )
                    missed = 0
                await _until(FOLLOW_FALLBACK_S, written, worker.exited)
        rest = await asyncio.to_thread(follower.rest)
        self._reply(request_id, agent_pb2.LogChunk(worker_id=key, text=rest, ended=True))


async def _until(seconds: float, *events: asyncio.Event) -> None:
    """Until one of the events is set, or the time is up. (Not ``asyncio.wait_for``: on Python
    3.11 it can swallow a cancellation that comes as the event is set, and a follow stopped by
    the server would go on.)"""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
