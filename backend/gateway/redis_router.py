"""Log requests taken, through Redis, to the API replica that holds the machine's stream.

- ``<prefix>:machine:<machine id>`` names the replica holding the machine's stream
  (backend/gateway/claims.py). It is set when the stream opens (the newest stream wins),
  refreshed while it lives, deleted when it closes; it expires after ``claim_ttl`` seconds, so
  the claims of a replica that died go too.
- ``<prefix>:replica:<replica id>`` is the channel a replica listens on, for requests
  (``tail``, ``follow``, ``stop``) and for the answers to its own (``log``, ``chunk``,
  ``alive``, ``end``). Messages are JSON and carry the request's id and their sender.
- A follow is relayed chunk by chunk; a quiet one is kept alive every ``keepalive`` seconds.
  The asker keeps a bounded backlog (a reader behind is told how many lines it missed) and
  says ``stop`` when its reader goes; a holder that stops answering ends the follow after
  three keepalives; chunks for a follow nobody reads any more are answered with ``stop``.

An answer that does not come within the asker's wait is no answer: ``None``, never an error,
so the HTTP answer is 400 TASK_LOG_UNAVAILABLE. When Redis itself cannot be reached the asker
says so (``REDIS_AWAY``); a relayed follow ends with that error as soon as the asker loses its
channel, and the holder stops relaying once Redis stops taking its chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from agent.backoff import Backoff
from backend.gateway.claims import CLAIM_TTL, Claims
from backend.gateway.follow_buffer import FOLLOW_BUFFER, FollowBuffer, LogChunkInfo
from backend.gateway.servicer import AgentService
from backend.logs.service import LogText, LogUnavailable, WorkerRef

log = logging.getLogger(__name__)

PREFIX = "astraeus:logs"
HOLDER_SHARE = 0.8  # of the asker's wait, what the holder waits for the machine
FOLLOW_KEEPALIVE = 5.0  # seconds between the holder's "still here" on a quiet follow
SILENT_KEEPALIVES = 3  # an asker that hears nothing for this many keepalives stops waiting
LISTEN_RETRY_FIRST = 0.2  # seconds before the first attempt to listen again
LISTEN_RETRY_MAX = 1.0  # seconds between attempts to listen again, at most
LISTEN_WAIT = 2.0  # seconds serving() waits for the channel before going on without it
REDIS_TIMEOUT = 2.0  # seconds a Redis command may take before it counts as failed
REDIS_AWAY = (
    "this API replica does not hold its machine's stream, and Redis, which carries requests "
    "between replicas, cannot be reached."
)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Until the event is set or the time is up. (Not ``asyncio.wait_for``: on Python 3.11 it
    can swallow a cancellation that comes as the event is set, and a task would not stop.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


class Backlog:
    """A relayed follow as its asker has it: the chunks not read yet, at most ``size``
    (``buffer``: the lines of those that do not fit are counted as missed), and whether more
    can come."""

    def __init__(self, size: int, keepalive: float) -> None:
        self.buffer = FollowBuffer(size)
        self.keepalive = keepalive
        self.gone = False  # the holder's follow finished without the worker ending
        self.lost = False  # the asker lost its Redis channel: nothing more can arrive
        self.heard = asyncio.get_running_loop().time()

    def hear(self, message: dict[str, Any]) -> None:
        self.heard = asyncio.get_running_loop().time()
        if message["type"] == "chunk":
            self.buffer.offer(
                LogChunkInfo(
                    str(message["text"]),
                    bool(message["archived"]),
                    int(message["missed"]),
                    bool(message["ended"]),
                )
            )
        elif message["type"] == "end":
            self.gone = True
            self.buffer.arrived.set()

    def lose(self) -> None:
        """The asker lost its Redis channel: the reader waits no more."""
        self.lost = True
        self.buffer.arrived.set()

    async def next(self) -> LogChunkInfo | None:
        """The next chunk; None once the holder's follow is over or it has gone silent."""
        loop = asyncio.get_running_loop()
        while (chunk := self.buffer.take()) is None:
            if self.gone or self.lost:
                return None
            if loop.time() - self.heard > SILENT_KEEPALIVES * self.keepalive:
                return None
            await _wait(self.buffer.arrived, self.keepalive)
        return chunk


class RedisRouter:
    """Replicas sharing one Redis: each records the machines it holds and answers for them.

    Nothing here waits on a cancellation reaching into redis-py (it can swallow one that
    lands mid-command): deadlines are socket timeouts and ``asyncio.wait``, and the loops
    also stop on ``stopping`` and on their follow being dropped."""

    def __init__(
        self,
        redis_url: str,
        *,
        prefix: str = PREFIX,
        claim_ttl: float = CLAIM_TTL,
        follow_buffer: int = FOLLOW_BUFFER,
        keepalive: float = FOLLOW_KEEPALIVE,
    ) -> None:
        self.replica_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # Fail fast: a request waits for a silent Redis seconds, never for ever.
        self.redis = Redis.from_url(
            redis_url,
            client_name=f"astraeus-logs:{self.replica_id}",  # which replica, in CLIENT LIST
            decode_responses=True,
            socket_connect_timeout=1.0,
            socket_timeout=REDIS_TIMEOUT,
            health_check_interval=10,
            retry=Retry(NoBackoff(), 1),
        )
        self.prefix = prefix
        self.claims = Claims(self.redis, prefix, self.replica_id, claim_ttl)
        self.follow_buffer = follow_buffer
        self.keepalive = keepalive
        self.local: AgentService | None = None
        self.listening = asyncio.Event()
        self.stopping = False
        self.pending: dict[str, asyncio.Future[dict[str, Any]]] = {}  # tails asked elsewhere
        self.backlogs: dict[str, Backlog] = {}  # follows asked elsewhere
        self.relays: dict[str, asyncio.Task[None]] = {}  # follows relayed for others
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def inbox(self) -> str:
        return self._inbox(self.replica_id)

    def _inbox(self, replica_id: str) -> str:
        return f"{self.prefix}:replica:{replica_id}"

    def stream_changed(self, machine_id: int, held: bool) -> None:
        self.claims.stream_changed(machine_id, held)

    # --- the channel -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def serving(self, local: AgentService | None) -> AsyncIterator[None]:
        """Listen and keep claims; on leaving, stop relaying and give the claims up."""
        self.local = local
        self._spawn(self._listen())
        self._spawn(self.claims.keep())
        await _wait(self.listening, LISTEN_WAIT)
        try:
            yield
        finally:
            self.stopping = True
            self.claims.stop()
            tasks = list(self.tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=2 * REDIS_TIMEOUT)
            await self.claims.release_all()
            self.local = None
            await self.redis.aclose()

    async def _listen(self) -> None:
        # at most a second apart: until it listens again, log requests through this replica
        # answer that Redis cannot be reached, so it listens within a second of Redis's return
        # (one connection attempt a second meanwhile costs Redis nothing)
        retry = Backoff(LISTEN_RETRY_FIRST, LISTEN_RETRY_MAX)
        while not self.stopping:
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self.inbox)
                    self.listening.set()
                    retry.reset()
                    while not self.stopping:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=1.0
                        )
                        if message is not None and message["type"] == "message":
                            self._dispatch(message["data"])
            except (RedisError, OSError) as error:
                log.warning("lost this replica's Redis channel, listening again: %s", error)
            finally:
                if self.listening.is_set():
                    self.listening.clear()
                    for backlog in self.backlogs.values():  # their chunks can no longer come
                        backlog.lose()
            await asyncio.sleep(retry.wait())

    def _dispatch(self, data: str) -> None:
        try:
            self._take(json.loads(data))
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed log message: %.200s", data)

    def _take(self, message: dict[str, Any]) -> None:
        kind, request_id = message["type"], str(message["id"])
        if kind == "tail":
            self._spawn(self._answer_tail(message))
        elif kind == "follow":
            self.relays[request_id] = self._spawn(self._relay(message))
        elif kind == "stop":
            relay = self.relays.pop(request_id, None)
            if relay is not None:
                relay.cancel()
        elif kind == "log":
            future = self.pending.get(request_id)
            if future is not None and not future.done():
                future.set_result(message)
        elif kind in ("chunk", "alive", "end"):
            backlog = self.backlogs.get(request_id)
            if backlog is not None:
                backlog.hear(message)
            elif kind != "end":  # its reader is gone (a stop lost on the way): stop again
                self._spawn(self._stop(str(message["from"]), request_id))

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("log routing task failed", exc_info=task.exception())

    async def _publish(self, replica_id: str, /, **message: Any) -> bool:
        """Publish to a replica's channel; False when nobody listens there. Raises RedisError
        (or OSError) when Redis cannot be reached."""
        body = json.dumps({**message, "from": self.replica_id}, ensure_ascii=False)
        return int(await self.redis.publish(self._inbox(replica_id), body)) > 0

    async def _send(self, replica_id: str, /, **message: Any) -> bool:
        """As ``_publish``, False also when Redis is down: for answers, which nobody awaits."""
        try:
            return await self._publish(replica_id, **message)
        except (RedisError, OSError) as error:
            log.warning("could not reach replica %s through Redis: %s", replica_id, error)
            return False

    async def _ask(self, for_worker: str, holder: str, /, **request: Any) -> bool:
        """Send a request to the holder; False when it no longer listens (its claim has not
        expired yet). Raises LogUnavailable when Redis cannot be reached."""
        try:
            return await self._publish(holder, **request)
        except (RedisError, OSError) as error:
            log.warning("log of %s: Redis could not be asked: %s", for_worker, error)
            raise LogUnavailable(for_worker, REDIS_AWAY) from None

    async def _stop(self, holder: str, follow_id: str) -> None:
        await self._send(holder, type="stop", id=follow_id)

    async def _holder(self, machine_id: int, worker: WorkerRef) -> str | None:
        """The other replica holding the machine's stream, if one does. Raises LogUnavailable
        when Redis cannot be reached, or our channel is down (no answer could reach us)."""
        if not self.listening.is_set():
            raise LogUnavailable(worker.name, REDIS_AWAY)
        try:
            holder = await self.redis.get(self.claims.key(machine_id))
        except (RedisError, OSError) as error:
            log.warning("log of %s: Redis could not be asked: %s", worker.name, error)
            raise LogUnavailable(worker.name, REDIS_AWAY) from None
        if holder is None or holder == self.replica_id:
            return None  # nobody's, or ours from a stream this process no longer has
        return str(holder)

    # --- tails ---------------------------------------------------------------------------

    async def tail(
        self, machine_id: int, worker: WorkerRef, lines: int, max_bytes: int, wait_s: float
    ) -> LogText | None:
        if self.local is not None and self.local.streams.get(machine_id) is not None:
            return await self.local.tail(machine_id, worker, lines, max_bytes, wait_s)
        deadline = asyncio.get_running_loop().time() + wait_s
        holder = await self._holder(machine_id, worker)
        if holder is None:
            return None
        request_id = uuid.uuid4().hex
        answer = self.pending[request_id] = asyncio.get_running_loop().create_future()
        try:
            if not await self._ask(
                worker.name,
                holder,
                type="tail",
                id=request_id,
                reply_to=self.replica_id,
                machine=machine_id,
                worker=worker.name,
                worker_id=worker.id,
                lines=lines,
                max_bytes=max_bytes,
                wait_s=wait_s * HOLDER_SHARE,
            ):
                return None  # the holder is gone; its claim has not expired yet
            left = deadline - asyncio.get_running_loop().time()
            await asyncio.wait({answer}, timeout=max(left, 0))
        finally:
            self.pending.pop(request_id, None)
        if not answer.done() and not self.listening.is_set():
            raise LogUnavailable(worker.name, REDIS_AWAY)  # the answer could not have reached us
        if not answer.done() or not answer.result().get("found"):
            return None
        found = answer.result()
        return LogText(
            worker=worker.name, text=str(found["text"]), archived=bool(found["archived"])
        )

    async def _answer_tail(self, request: dict[str, Any]) -> None:
        found = None
        if self.local is not None:
            found = await self.local.tail(
                int(request["machine"]),
                _worker_of(request),
                int(request["lines"]),
                int(request["max_bytes"]),
                float(request["wait_s"]),
            )
        await self._send(
            str(request["reply_to"]),
            type="log",
            id=request["id"],
            found=found is not None,
            text=found.text if found else "",
            archived=found.archived if found else False,
        )

    # --- follows -------------------------------------------------------------------------

    async def follow(
        self, machine_id: int, worker: WorkerRef, tail_lines: int = 0
    ) -> AsyncGenerator[LogChunkInfo, None]:
        if self.local is not None and self.local.streams.get(machine_id) is not None:
            chunks = self.local.follow(machine_id, worker, tail_lines)
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    yield chunk
            return
        follow_id = uuid.uuid4().hex
        backlog = self.backlogs[follow_id] = Backlog(self.follow_buffer, self.keepalive)
        holder = None
        over = False
        try:
            holder = await self._holder(machine_id, worker)
            if holder is None or not await self._ask(
                worker.name,
                holder,
                type="follow",
                id=follow_id,
                reply_to=self.replica_id,
                machine=machine_id,
                worker=worker.name,
                worker_id=worker.id,
                tail_lines=tail_lines,
            ):
                over = True
                return
            while (relayed := await backlog.next()) is not None:
                over = relayed.ended
                yield relayed
                if over:
                    return
            over = True
            if backlog.lost:
                raise LogUnavailable(worker.name, REDIS_AWAY)
        finally:
            del self.backlogs[follow_id]
            if holder is not None and not over:  # the reader went away: the holder stops
                await self._stop(holder, follow_id)

    async def _relay(self, request: dict[str, Any]) -> None:
        """Follow a log for another replica, chunk by chunk, until it ends or is stopped."""
        follow_id, asker = str(request["id"]), str(request["reply_to"])
        relay = asyncio.current_task()
        assert relay is not None
        keepalive = self._spawn(self._keep_alive(asker, follow_id, relay))
        try:
            if self.local is not None:
                chunks = self.local.follow(
                    int(request["machine"]), _worker_of(request), int(request["tail_lines"])
                )
                async with contextlib.aclosing(chunks):
                    async for chunk in chunks:
                        sent = await self._send(
                            asker,
                            type="chunk",
                            id=follow_id,
                            text=chunk.text,
                            archived=chunk.archived,
                            missed=chunk.missed,
                            ended=chunk.ended,
                        )
                        if chunk.ended or not sent or self.relays.get(follow_id) is not relay:
                            return  # ended, its asker is gone, or it was stopped
            await self._send(asker, type="end", id=follow_id)
        finally:
            keepalive.cancel()
            if self.relays.get(follow_id) is relay:
                del self.relays[follow_id]

    async def _keep_alive(self, asker: str, follow_id: str, relay: asyncio.Task[None]) -> None:
        """Tell a quiet follow's asker it is still on; stop it once nobody listens there."""
        while not self.stopping:
            await asyncio.sleep(self.keepalive)
            if self.relays.get(follow_id) is not relay:
                return
            if not await self._send(asker, type="alive", id=follow_id):
                relay.cancel()
                return


def _worker_of(request: dict[str, Any]) -> WorkerRef:
    """The worker a relayed request names: its id for the machine, its name for sentences."""
    return WorkerRef(int(request["worker_id"]), str(request["worker"]))
