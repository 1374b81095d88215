"""The gRPC side of the agent protocol: one ``Connect`` stream per machine.

The agent opens the stream (the server never dials a machine) and says Hello; the server
answers Welcome. From then on the agent's messages are applied in order and acknowledged by
id, and the machine's unacknowledged commands (the outbox the lifecycle writes) are delivered.
A second stream from the same machine replaces the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncSession

from agent.backoff import Backoff
from backend.access.rules import bearer_secret
from backend.agents import service
from backend.agents.leases import LeaseKeeper, renew_interval
from backend.agents.service import (
    HelloInfo,
    KnownWorker,
    ProgressInfo,
    WorkerEventInfo,
    agent_time,
)
from backend.clock import Clock
from backend.db import Database, database_away
from backend.errors import DatabaseUnavailable, NotFound, Unauthenticated
from backend.lifecycle.sentences import EndCause
from backend.lifecycle.views import Effects
from backend.logs.service import LogText, WorkerRef
from backend.machine_identity import service as identity
from backend.machine_identity.rules import MachinePrincipal
from backend.machines import rules as machine_rules
from backend.machines import service as machines
from backend.machines.service import GpuInfo
from backend.metrics.rules import SampleIn
from backend.models import AgentCommand, Machine
from backend.runs.rules import Wait
from backend.secrets import service as secrets

log = logging.getLogger(__name__)

_STATES = {
    agent_pb2.WORKER_STATE_PREPARING: "preparing",
    agent_pb2.WORKER_STATE_PULLING: "pulling",
    agent_pb2.WORKER_STATE_READY: "ready",
    agent_pb2.WORKER_STATE_RUNNING: "running",
    agent_pb2.WORKER_STATE_EXITED: "exited",
}
# How a worker ended, as the agent says (an end it does not name is an exit).
_CAUSES = {
    agent_pb2.END_CAUSE_UNSPECIFIED: EndCause.EXITED,
    agent_pb2.END_CAUSE_EXITED: EndCause.EXITED,
    agent_pb2.END_CAUSE_OOM_KILLED: EndCause.OOM_KILLED,
    agent_pb2.END_CAUSE_SIGNALLED: EndCause.SIGNALLED,
    agent_pb2.END_CAUSE_NOT_FOUND: EndCause.NOT_FOUND,
    agent_pb2.END_CAUSE_LOST: EndCause.LOST,
    agent_pb2.END_CAUSE_LOST_BEFORE_START: EndCause.LOST_BEFORE_START,
    agent_pb2.END_CAUSE_IMAGE_PULL: EndCause.IMAGE_PULL,
    agent_pb2.END_CAUSE_NOT_STARTED: EndCause.NOT_STARTED,
    agent_pb2.END_CAUSE_STOPPED_BEFORE_START: EndCause.STOPPED_BEFORE_START,
}
# What a preparing or pulling worker waits for, as the agent says (unspecified: nothing said).
_WAITS = {
    agent_pb2.WAIT_SECRET: Wait.SECRET,
    agent_pb2.WAIT_DRIVE: Wait.DRIVE,
    agent_pb2.WAIT_IMAGE: Wait.IMAGE,
}
_COMMANDS = {
    "start": agent_pb2.COMMAND_KIND_START,
    "release": agent_pb2.COMMAND_KIND_RELEASE,
    "stop": agent_pb2.COMMAND_KIND_STOP,
    "delete": agent_pb2.COMMAND_KIND_DELETE,
}


FOLLOW_BUFFER = 64  # chunks (each at most 256 KiB) held for one follower


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


RECEIVED_MAX = 10_000
# A machine's messages written, at most, before one Ack says so (when more of them wait).
ACK_EVERY = 50


class _Closed(asyncio.Event):
    """A stream's end: set, it also wakes the stream's sender (an empty message), so the
    sender waits on its queue alone, not on two things for each message."""

    def __init__(self, outgoing: asyncio.Queue[agent_pb2.ServerMessage | None]) -> None:
        super().__init__()
        self._outgoing = outgoing

    def set(self) -> None:
        if not self.is_set():
            super().set()
            self._outgoing.put_nowait(None)


@dataclass
class MachineStream:
    """What the server holds for one connected machine."""

    machine_id: int
    # What goes to the machine; None only once the stream is closed (it wakes the sender).
    outgoing: asyncio.Queue[agent_pb2.ServerMessage | None] = field(default_factory=asyncio.Queue)
    pending: dict[int, asyncio.Future[agent_pb2.Reply]] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    last_command_sent: int = 0
    closed: asyncio.Event = field(init=False)
    # Who the stream's token speaks for: its credential is checked with all the replica's
    # streams' (AgentService._delivering).
    agent: MachinePrincipal | None = None
    # Why the server ends the stream (its credential was revoked): the agent is told so.
    refusal: str | None = None
    follows: dict[int, Follow] = field(default_factory=dict)
    # The machine's messages in the order they came, for the writer: applied to the database
    # (waiting out an outage) and acknowledged in that order. Replies are answered at once.
    # Bounded: a machine whose messages cannot be written is read no faster than they are
    # once this many wait (an hour and more of one machine's reports).
    received: asyncio.Queue[agent_pb2.AgentMessage] = field(
        default_factory=lambda: asyncio.Queue(maxsize=RECEIVED_MAX)
    )

    def __post_init__(self) -> None:
        self.closed = _Closed(self.outgoing)

    def send(self, **body: Any) -> int:
        message_id = next(self.ids)
        self.outgoing.put_nowait(agent_pb2.ServerMessage(id=message_id, **body))
        return message_id

    async def request(self, wait_s: float, **body: Any) -> agent_pb2.Reply:
        """Send a request and wait for the agent's reply to it."""
        message_id = next(self.ids)
        future: asyncio.Future[agent_pb2.Reply] = asyncio.get_running_loop().create_future()
        self.pending[message_id] = future
        self.outgoing.put_nowait(agent_pb2.ServerMessage(id=message_id, **body))
        try:
            return await asyncio.wait_for(future, wait_s)
        finally:
            self.pending.pop(message_id, None)


Handler = Callable[..., Awaitable[Effects | None]]

# Messages of many machines written in one transaction, at most; and how many such
# transactions at once (the rest of the pool is the requests'). A stream's messages wait
# for a writer rather than each for a connection of the pool (whose wait times out).
WRITE_BATCH = 50
WRITERS = 2
# How long a writer waits, once a message came, for others to write with it (unless a whole
# batch waits already): a transaction's cost (a connection, its ping, BEGIN, COMMIT) is paid
# for a few machines' messages instead of for each, for a few hundredths of a second later.
WRITE_LINGER_S = 0.02
# What is written with other machines' messages: samples, progress and acknowledgements,
# most of what machines send. Each takes its rows' locks (a run's, its workers', commands') in
# the order of its worker's id, and a batch is written in that order, so two batches, or a
# batch and a scheduling pass (runs in id order), take them in one order. The rest is
# written alone: a worker's state changes and GPU faults take wider locks (a gang's, a
# machine's), and a secret request answers on the stream, which a batch tried again would
# do twice. (Batching worker events too deadlocked with scheduling passes at 1 000 machines.)
_BATCHED = frozenset({"metrics", "progress", "command_ack"})


# A machine's messages written together, at most: the next ones waiting, while they are
# batched ones (and at most one sample batch, whose GPU utilisation folds into the worker's
# once a batch).
GROUP_MAX = 50


def _group(
    first: agent_pb2.AgentMessage, waiting: asyncio.Queue[agent_pb2.AgentMessage]
) -> tuple[list[agent_pb2.AgentMessage], agent_pb2.AgentMessage | None]:
    """The machine's messages to write together, starting with ``first``: the next ones
    already waiting, while each is batched (samples, progress, acknowledgements) or writes
    nothing (heartbeats, replies). Issue 19: a stream wrote one message per batch, so a
    machine sending more than its writer's round trips allowed (a busy server) fell minutes
    behind, its workers' ends queued behind its progress. Batched messages are each written
    as many times as asked (written again they change nothing), so a group is tried again
    whole. Returns the group, and the message taken that ends it (written next), if any."""
    group = [first]
    if not _groups(first):
        return group, None
    samples = first.WhichOneof("body") == "metrics"
    while len(group) < GROUP_MAX and not waiting.empty():
        message = waiting.get_nowait()
        is_samples = message.WhichOneof("body") == "metrics"
        if not _groups(message) or (samples and is_samples):
            return group, message
        samples |= is_samples
        group.append(message)
    return group, None


def _groups(message: agent_pb2.AgentMessage) -> bool:
    kind = message.WhichOneof("body")
    return kind in _BATCHED or kind not in AgentService._handlers


def _lock_order(message: agent_pb2.AgentMessage) -> int:
    """Where a batched message goes in its batch: by the worker whose rows it locks."""
    kind = message.WhichOneof("body")
    if kind == "progress":
        return message.progress.worker_id
    if kind == "metrics":
        return min((s.worker_id for s in message.metrics.samples), default=0)
    return 0  # acknowledgements lock only their own commands, in id order


@dataclass
class _Write:
    machine: Machine
    message: agent_pb2.AgentMessage
    handler: Handler
    batched: bool
    done: asyncio.Future[Effects | None]


StreamHook = Callable[[int, bool], None]  # (machine id, held): a stream opened or closed here


class Streams:
    """The machines whose stream this process holds; ``on_change`` hears of each one taken
    or let go (the log router records which replica holds a machine)."""

    def __init__(self, on_change: StreamHook | None = None) -> None:
        self.by_machine: dict[int, MachineStream] = {}
        self.on_change = on_change or (lambda machine_id, held: None)

    def open(self, machine_id: int) -> MachineStream:
        old = self.by_machine.get(machine_id)
        if old is not None:
            old.closed.set()  # a new registration replaces an old stream
        stream = MachineStream(machine_id)
        self.by_machine[machine_id] = stream
        self.on_change(machine_id, True)
        return stream

    def close(self, stream: MachineStream) -> None:
        stream.closed.set()
        if self.by_machine.get(stream.machine_id) is stream:
            del self.by_machine[stream.machine_id]
            self.on_change(stream.machine_id, False)

    def get(self, machine_id: int) -> MachineStream | None:
        return self.by_machine.get(machine_id)


@dataclass(frozen=True)
class LogChunkInfo:
    """Lines of a followed log: ``missed`` lines were dropped before them; ``ended`` is last."""

    text: str
    archived: bool
    missed: int
    ended: bool


def _facts(hello: agent_pb2.Hello) -> machine_rules.MachineFacts:
    return machine_rules.MachineFacts(
        name=hello.machine,
        pool=hello.pool,
        cpu_cores=hello.cpu_cores,
        memory_bytes=hello.memory_bytes,
        gpus=tuple(
            machine_rules.GpuFacts(g.index, g.uuid, g.model, g.memory_bytes, g.health_reason)
            for g in hello.gpus
        ),
        agent_version=hello.agent_version,
        known_workers=len(hello.workers),
        advertise_address=hello.advertise_address,
        executor=hello.executor,
        unmeasured_metrics=tuple(hello.unmeasured_metrics),
    )


def _hello_info(hello: agent_pb2.Hello) -> HelloInfo:
    return HelloInfo(
        machine=hello.machine,
        pool=hello.pool or None,
        cpu_cores=hello.cpu_cores,
        memory_bytes=hello.memory_bytes,
        gpus=[
            GpuInfo(g.index, g.uuid, g.model, g.memory_bytes, g.healthy, g.health_reason)
            for g in hello.gpus
        ],
        workers=tuple(KnownWorker(k.worker_id, k.attempt, k.ended) for k in hello.workers),
        advertise_address=hello.advertise_address,
        executor=hello.executor or "process",
        unmeasured_metrics=tuple(hello.unmeasured_metrics),
    )


class AgentService(agent_pb2_grpc.AgentServicer):
    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        lease: timedelta,
        poll_interval: float = 0.5,
        on_freed: Callable[[], None] = lambda: None,
        on_stream: StreamHook | None = None,
        renew_interval_s: float | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.lease = lease
        self.poll_interval = poll_interval
        self.on_freed = on_freed
        self.streams = Streams(on_stream)
        # One loop for all this replica's streams: their new commands and whether their
        # credentials still hold, a query or two per poll however many streams there are.
        self._delivery: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # The machines' messages waiting to be written, and the writers that write them.
        # Each entry one stream's group of messages (_group), written in one batch.
        self._writes: asyncio.Queue[list[_Write]] = asyncio.Queue()
        self._writers: list[asyncio.Task[None]] = []
        # The batches being written: each finishes its transaction even when its writer is
        # cancelled (the last stream ended), so none is cut off holding a connection.
        self._batches: set[asyncio.Task[None]] = set()
        self.leases = LeaseKeeper(
            db,
            clock,
            lease,
            interval=renew_interval_s or renew_interval(lease),
            backlogged=self._backlogged,
            lost=self._lost,
        )

    async def Connect(
        self,
        request_iterator: AsyncIterator[agent_pb2.AgentMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[agent_pb2.ServerMessage]:
        # The Hello is read before the token is judged: a refusal sent while the agent is still
        # writing reaches it as INTERNAL ("Internal error from Core", grpc/grpc#36066) instead
        # of the refusal's code and sentence, and an agent stops only on a refusal it can read.
        # A message is at most the stream's limit, so reading one costs an anonymous caller
        # nothing big.
        first = await anext(aiter(request_iterator), None)
        agent = await self._authenticate(context)
        if first is None or first.WhichOneof("body") != "hello":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "The first message must be a Hello."
            )
        assert first is not None
        if first.hello.protocol < PROTOCOL:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, OLD_AGENT)
        problem = machine_rules.registration_problem(_facts(first.hello))
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Hello refused: {problem}.")
        info = _hello_info(first.hello)
        try:
            async with self.db.transaction() as session:
                refusal = await identity.registration_refusal(session, agent, info.machine)
                if refusal is None:
                    await identity.mark_used(session, self.clock, agent)
                    machine = await service.hello(session, self.clock, agent, info, self.lease)
                    to_stop, fx = await service.reconcile(
                        session, self.clock, machine, info.workers
                    )
        except Exception as error:
            if isinstance(error, PoolTimeout):  # the agent says Hello again later
                await context.abort(grpc.StatusCode.UNAVAILABLE, BUSY)
            if not database_away(error):
                # What the database said stays in the server's log, never on the wire.
                log.exception("machine %r could not be registered", info.machine)
                await context.abort(grpc.StatusCode.INTERNAL, REGISTRATION_FAILED)
            await context.abort(grpc.StatusCode.UNAVAILABLE, DatabaseUnavailable().message)
            raise  # abort raises; this keeps type checkers sure
        if refusal is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        if fx.freed:
            self.on_freed()
        stream = self.streams.open(machine.id)
        stream.agent = agent
        self.leases.start()
        log.info("machine %s connected", machine.name)
        stream.send(
            welcome=agent_pb2.Welcome(
                machine_id=machine.id, lease_seconds=int(self.lease.total_seconds())
            )
        )
        stream.send(ack=agent_pb2.Ack(up_to=first.id))
        for worker_id in to_stop:  # not this machine's any more: no command row to keep
            stream.send(
                command=agent_pb2.Command(kind=agent_pb2.COMMAND_KIND_STOP, worker_id=worker_id)
            )
        tasks = [
            asyncio.create_task(_ending_on_failure(stream, self._read(stream, request_iterator))),
            asyncio.create_task(_ending_on_failure(stream, self._write(stream, machine))),
        ]
        self._deliver_soon()
        try:
            while not stream.closed.is_set():
                message = await stream.outgoing.get()
                if message is None or stream.closed.is_set():
                    break
                yield message
            if stream.refusal is not None:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, stream.refusal)
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.streams.close(stream)
            if not self.streams.by_machine:
                delivery, self._delivery = self._delivery, None
                if delivery is not None:
                    delivery.cancel()
                if self._writes.empty():  # nothing left to write: the writers stop
                    for writer in self._writers:
                        writer.cancel()
                    self._writers = []
                await self.leases.stop()
            log.info("machine %s disconnected", machine.name)

    async def tail(
        self, machine_id: int, worker: WorkerRef, lines: int, max_bytes: int, wait_s: float
    ) -> LogText | None:
        """Ask the machine for a worker's last lines; None when it is not here or silent."""
        stream = self.streams.get(machine_id)
        if stream is None:
            return None
        request = agent_pb2.LogTailRequest(worker_id=worker.id, lines=lines, max_bytes=max_bytes)
        try:
            reply = await stream.request(wait_s, log_tail=request)
        except TimeoutError:
            return None
        if reply.WhichOneof("body") != "log":
            return None
        return LogText(worker=worker.name, text=reply.log.text, archived=reply.log.archived)

    async def follow(
        self, machine_id: int, worker: WorkerRef, tail_lines: int = 0
    ) -> AsyncIterator[LogChunkInfo]:
        """A worker's new log lines as its machine writes them, until it ends.

        Begins with its last ``tail_lines`` lines. Ends when the worker does (the last chunk
        says ``ended``), or quietly when the machine's stream goes; the caller closing the
        iterator tells the machine to stop.
        """
        stream = self.streams.get(machine_id)
        if stream is None:
            return
        request_id = next(stream.ids)
        follow = Follow()
        stream.follows[request_id] = follow
        stream.outgoing.put_nowait(
            agent_pb2.ServerMessage(
                id=request_id,
                log_follow_start=agent_pb2.LogFollowStart(
                    worker_id=worker.id, follow_id=str(request_id), tail_lines=tail_lines
                ),
            )
        )
        try:
            while True:
                getter = asyncio.ensure_future(follow.chunks.get())
                closed = asyncio.ensure_future(stream.closed.wait())
                done, _ = await asyncio.wait({getter, closed}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    return
                closed.cancel()
                chunk = getter.result()
                yield LogChunkInfo(chunk.text, chunk.archived, chunk.missed_lines, chunk.ended)
                if chunk.ended:
                    return
        finally:
            del stream.follows[request_id]
            if not stream.closed.is_set():
                stream.send(log_follow_stop=agent_pb2.LogFollowStop(follow_id=str(request_id)))

    async def Join(
        self, request: agent_pb2.JoinRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.JoinReply:
        """A join token exchanged for the machine's own credential (shown this once)."""
        try:
            async with self.db.transaction() as session:
                issued = await identity.join(
                    session, self.clock, _bearer(context) or "", request.machine
                )
        except identity.JoinRefused as refused:
            code = grpc.StatusCode.UNAUTHENTICATED
            if not refused.unauthenticated:
                code = grpc.StatusCode.PERMISSION_DENIED
            await context.abort(code, refused.message)
            raise  # abort raises; this keeps type checkers sure
        except Exception as error:
            if isinstance(error, PoolTimeout):  # the agent tries again later
                await context.abort(grpc.StatusCode.UNAVAILABLE, BUSY)
            if not database_away(error):
                raise
            await context.abort(grpc.StatusCode.UNAVAILABLE, DatabaseUnavailable().message)
            raise
        log.info("machine %s joined with a join token", request.machine)
        return agent_pb2.JoinReply(credential=issued.secret, machine=request.machine)

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> MachinePrincipal:
        try:
            async with self.db.read() as session:
                return await identity.authenticate(session, _bearer(context))
        except Unauthenticated as error:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, error.message)
            raise  # abort raises; this keeps type checkers sure
        except Exception as error:
            if isinstance(error, PoolTimeout):  # the agent tries again later
                await context.abort(grpc.StatusCode.UNAVAILABLE, BUSY)
            if not database_away(error):
                raise
            await context.abort(grpc.StatusCode.UNAVAILABLE, DatabaseUnavailable().message)
            raise

    async def _read(
        self, stream: MachineStream, request_iterator: AsyncIterator[agent_pb2.AgentMessage]
    ) -> None:
        """Take the machine's messages as they come: each says the machine is alive (its
        lease is renewed with the others', backend/agents/leases.py); replies (log lines
        asked for) are answered at once, database or not; every message goes on to the
        writer."""
        async for message in request_iterator:
            self.leases.note(stream.machine_id)
            if message.WhichOneof("body") == "reply":
                _answered(stream, message.reply)
            await stream.received.put(message)

    async def _write(self, stream: MachineStream, machine: Machine) -> None:
        """Apply the machine's messages in order, acknowledging them once written: an Ack
        says "all up to this one", so one is sent when no other message of the machine waits
        (or after ACK_EVERY of them), not one per message (issue 19: at a thousand machines
        the acknowledgements were half of what the server sent)."""
        unacknowledged = 0
        carried: agent_pb2.AgentMessage | None = None
        while True:
            first = carried if carried is not None else await stream.received.get()
            group, carried = _group(first, stream.received)
            await self._apply_when_possible(machine, group)
            unacknowledged += len(group)
            if (carried is None and stream.received.empty()) or unacknowledged >= ACK_EVERY:
                stream.send(ack=agent_pb2.Ack(up_to=group[-1].id))
                unacknowledged = 0

    async def _apply_when_possible(
        self, machine: Machine, group: list[agent_pb2.AgentMessage]
    ) -> None:
        """Apply the messages; while the database is away they wait and are tried again (the
        stream, and the log follows and tails that ride on it, go on); a group of several is
        of messages written again unchanged (_group). A heartbeat writes nothing: that it was
        read renewed the lease already."""
        retry = Backoff(OUTAGE_RETRY_START, OUTAGE_RETRY_CAP)
        while True:
            try:
                await self._apply(machine, group)
                return
            except Exception as error:
                # a pool with no connection free in time is the database too busy: waited out
                if not database_away(error) and not isinstance(error, PoolTimeout):
                    raise
                wait = retry.wait()
                log.warning(
                    "machine %s: the database is away; its message %d waits %.1fs",
                    machine.name,
                    group[0].id,
                    wait,
                )
                await asyncio.sleep(wait)

    async def _apply(self, machine: Machine, group: list[agent_pb2.AgentMessage]) -> None:
        """Written with other machines' messages (``_writing``), the group's together;
        raises what writing one of them alone raised."""
        loop = asyncio.get_running_loop()
        writes: list[_Write] = []
        for message in group:
            kind = message.WhichOneof("body") or ""
            handler = self._handlers.get(kind)
            if handler is not None:
                writes.append(
                    _Write(machine, message, handler, kind in _BATCHED, loop.create_future())
                )
        if not writes:
            return
        self._writes.put_nowait(writes)
        self._start_writers()
        await asyncio.wait([w.done for w in writes])
        for w in writes:
            fx = w.done.result()  # raises what writing it raised
            if fx is not None and fx.freed:
                self.on_freed()

    def _start_writers(self) -> None:
        self._writers = [w for w in self._writers if not w.done()]
        while len(self._writers) < WRITERS:
            self._writers.append(asyncio.create_task(self._writing()))

    async def _writing(self) -> None:
        """One of the replica's writers: the machines' messages waiting to be written, up to
        WRITE_BATCH of them (each stream has at most one waiting, so a stream's messages keep
        their order), in one transaction: a transaction's own cost (a connection, BEGIN,
        COMMIT, the session) paid once for many machines, not for each message. If one of
        them fails, each is written alone, so its failure is its own."""
        while True:
            batch = list(await self._writes.get())
            if len(batch) + self._writes.qsize() < WRITE_BATCH:
                await asyncio.sleep(WRITE_LINGER_S)  # let other machines' messages join it
            while len(batch) < WRITE_BATCH and not self._writes.empty():
                batch.extend(self._writes.get_nowait())
            writing = asyncio.create_task(self._write_batch(batch))
            self._batches.add(writing)
            writing.add_done_callback(self._batches.discard)
            try:
                await asyncio.shield(writing)
            except Exception as error:  # never expected: each was settled with its own
                for w in batch:
                    if not w.done.done():
                        w.done.set_exception(error)

    @property
    def idle(self) -> bool:
        """No stream, no batch being written, no lease renewal left (a server stopped)."""
        return not self.streams.by_machine and not self._batches and self.leases.idle

    async def _write_batch(self, batch: list[_Write]) -> None:
        """The batch's progress reports and samples in a few statements for them all
        (service.reports), its acknowledgements beside them, in one transaction; then what
        that left (reports whose rows another transaction held, or that change a worker's
        state) and the rest of the batch, each alone."""
        together = sorted((w for w in batch if w.batched), key=lambda w: _lock_order(w.message))
        alone = [w for w in batch if not w.batched]
        utilization: dict[tuple[int, int], float] = {}
        if together:
            progress = [w for w in together if w.message.WhichOneof("body") == "progress"]
            metrics = [w for w in together if w.message.WhichOneof("body") == "metrics"]
            others = [w for w in together if w not in progress and w not in metrics]
            try:
                results: list[Effects | None] = []
                async with self.db.transaction() as session:
                    left = await service.reports(
                        session,
                        self.clock,
                        [self._progress_info(w.machine, w.message) for w in progress],
                        [(w.machine.id, _samples(w.message)) for w in metrics],
                    )
                    for w in others:
                        results.append(await w.handler(self, session, w.machine, w.message))
            except Exception:
                alone = batch  # which one failed is found by writing each alone
            else:
                again = {id(progress[i]) for i in left.progress}
                alone += [w for w in progress if id(w) in again]
                utilization = left.utilization
                written = [w for w in progress + metrics if id(w) not in again]
                for w, fx in [*zip(others, results, strict=True), *((w, None) for w in written)]:
                    if not w.done.done():
                        w.done.set_result(fx)
        else:
            alone = batch
        if utilization:
            try:
                async with self.db.transaction() as session:
                    await service.record_gpu_utilizations(session, utilization)
            except Exception:  # a pace is an estimate: this one's loss is logged, not fatal
                log.exception(
                    "GPU utilisation of %d workers could not be written", len(utilization)
                )
        for w in alone:
            try:
                async with self.db.transaction() as session:
                    fx = await w.handler(self, session, w.machine, w.message)
            except Exception as error:
                if not w.done.done():
                    w.done.set_exception(error)
            else:
                if not w.done.done():
                    w.done.set_result(fx)

    def _backlogged(self) -> list[int]:
        """The machines whose messages wait unread: the server writes them too slowly."""
        return [m for m, s in self.streams.by_machine.items() if s.received.full()]

    def _lost(self, machine_ids: set[int]) -> None:
        """Machines found lost when heard from: their streams end, and their agents register
        again."""
        for machine_id in machine_ids:
            stream = self.streams.get(machine_id)
            if stream is not None:
                log.warning("machine %d was lost; its stream ends: it registers again", machine_id)
                stream.closed.set()

    async def _worker_event(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> Effects:
        e = message.worker_event
        event = WorkerEventInfo(
            worker_id=e.worker_id,
            attempt=e.attempt or None,
            kind=_STATES[e.state],
            at=agent_time(e.at_ms, self.clock.now()),
            reason=e.reason[: machine_rules.MAX_WORKER_REASON],
            waits=(
                (_WAITS[e.waits_for], e.waits_on[: machine_rules.MAX_WAITS_ON])
                if e.waits_for in _WAITS
                else None
            ),
            exit_code=e.exit_code if e.HasField("exit_code") else None,
            log_tail=e.log_tail[-machine_rules.MAX_LOG_TAIL :],
            cause=_CAUSES.get(e.cause, EndCause.EXITED),
            signal=e.signal if e.HasField("signal") else None,
            detail=e.detail[: machine_rules.MAX_DETAIL],
        )
        return await service.worker_event(session, self.clock, machine.id, event)

    def _progress_info(self, machine: Machine, message: agent_pb2.AgentMessage) -> ProgressInfo:
        p = message.progress
        step = p.step if p.HasField("step") else None
        at = agent_time(p.at_ms, self.clock.now())
        return ProgressInfo(machine.id, p.worker_id, p.attempt or None, step, at)

    async def _progress(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> Effects:
        p = self._progress_info(machine, message)
        return await service.progress(
            session, self.clock, p.machine_id, p.worker_id, p.attempt, p.step, p.at
        )

    async def _gpu_health(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> Effects:
        h = message.gpu_health
        row = await session.get(Machine, machine.id)
        assert row is not None
        reason = h.reason[: machine_rules.MAX_HEALTH_REASON]
        try:
            return await service.gpu_health(session, self.clock, row, h.index, h.healthy, reason)
        except NotFound as refused:  # a GPU it never registered: refused, the stream goes on
            log.warning("machine %s: GpuHealth refused: %s", machine.name, refused.message)
            return Effects()

    async def _command_ack(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> None:
        await service.acknowledge(
            session, self.clock, machine.id, list(message.command_ack.command_ids)
        )

    async def _secret_request(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> Effects | None:
        asked = message.secret_request
        found = await secrets.values_for_worker(session, machine.id, asked.worker_id, asked.attempt)
        stream = self.streams.get(machine.id)
        if found is None or stream is None:
            return None  # not this machine's worker (or not this attempt): it gets nothing
        answer = agent_pb2.SecretValues(
            worker_id=asked.worker_id, values=found.values, missing=found.missing
        )
        size = answer.ByteSize()
        if size > MESSAGE_LIMIT:
            reason = too_large(
                "The values of its secrets are", size, "give the run fewer or smaller secrets"
            )
            return await service.fail_worker(
                session, self.clock, machine.id, asked.worker_id, asked.attempt, reason
            )
        stream.send(secret_values=answer)
        return None

    async def _metrics(
        self, session: AsyncSession, machine: Machine, message: agent_pb2.AgentMessage
    ) -> None:
        await service.metrics(session, machine.id, _samples(message), self.clock)

    _handlers: dict[str, Handler] = {
        "metrics": _metrics,
        "secret_request": _secret_request,
        "worker_event": _worker_event,
        "progress": _progress,
        "gpu_health": _gpu_health,
        "command_ack": _command_ack,
    }

    def _deliver_soon(self) -> None:
        """Look for commands now (a stream opened): the delivery loop runs while this
        replica holds streams."""
        self._wake.set()
        if self._delivery is None or self._delivery.done():
            self._delivery = asyncio.create_task(self._delivering())

    async def _delivering(self) -> None:
        """While this replica holds streams: every poll interval, one query for all of their
        machines' new unacknowledged commands (sent in order on each machine's stream; none
        while the database is away), and every REVOCATION_CHECK_S one for whether their
        credentials still hold (a stream whose credential was revoked ends, saying why). A
        stream opening wakes it at once."""
        loop = asyncio.get_running_loop()
        checked = -REVOCATION_CHECK_S
        while self.streams.by_machine:
            self._wake.clear()
            check = loop.time() - checked >= REVOCATION_CHECK_S
            try:
                await self._deliver_once(check)
                if check:
                    checked = loop.time()
            except Exception as error:
                if not database_away(error):
                    log.exception("commands could not be delivered; they are tried again")
            with contextlib.suppress(TimeoutError):  # not wait_for: see routing._wait
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()

    async def _deliver_once(self, check_credentials: bool) -> None:
        streams = [s for s in self.streams.by_machine.values() if not s.closed.is_set()]
        if not streams:
            return
        refused: dict[MachinePrincipal, str] = {}
        async with self.db.read() as session:
            if check_credentials:
                refused = await identity.revoked_among(
                    session, {s.agent for s in streams if s.agent is not None}
                )
            commands = await service.new_commands(
                session, {s.machine_id: s.last_command_sent for s in streams}
            )
        for stream in streams:
            if stream.agent is not None and stream.agent in refused:
                stream.refusal = refused[stream.agent]
                stream.closed.set()
                continue
            try:
                await self._send_commands(stream, commands.get(stream.machine_id, []))
            except Exception as error:
                if database_away(error):
                    raise
                log.exception("commands of machine %s could not be sent", stream.machine_id)
                stream.closed.set()  # it registers again, and its commands are sent again

    async def _send_commands(self, stream: MachineStream, commands: list[AgentCommand]) -> None:
        """The machine's new commands on its stream, in order. A command too large for the
        stream is never sent: its worker fails with a reason instead, and the stream carries
        the next one."""
        for c in commands:
            if stream.closed.is_set() or c.id <= stream.last_command_sent:
                return
            message = agent_pb2.Command(
                command_id=c.id,
                kind=_COMMANDS[c.kind],
                worker_id=c.target_worker_id or 0,
                start=start_message(c) if c.kind == "start" else None,
            )
            size = message.ByteSize()
            if size > MESSAGE_LIMIT:
                await self._undeliverable(stream.machine_id, c, size)
            else:
                stream.send(command=message)
            stream.last_command_sent = c.id

    def close_streams(self) -> None:
        """The server is stopping: every stream ends now (its agent reconnects, to this
        replica once it is back or to another), rather than each waiting out the gRPC
        server's grace."""
        for stream in list(self.streams.by_machine.values()):
            stream.closed.set()

    async def _undeliverable(self, machine_id: int, command: AgentCommand, size: int) -> None:
        """A command the stream cannot carry: set aside, and its worker fails saying why."""
        reason = too_large(f"Its {command.kind} command is", size)
        async with self.db.transaction() as session:
            fx = await service.undeliverable(session, self.clock, machine_id, command.id, reason)
        if fx.freed:
            self.on_freed()


def _bearer(context: grpc.aio.ServicerContext) -> str | None:
    metadata = dict(context.invocation_metadata() or ())
    return bearer_secret(str(metadata.get("authorization", "")))


REGISTRATION_FAILED = "The server could not register this machine; its log says why."
BUSY = "The server is busy (no database connection free in time): try again shortly."
# The most a message to an agent may be: gRPC's default limit on what a channel receives
# (4 MiB), less room for the message's own framing.
MESSAGE_LIMIT = 4 * 2**20 - 64 * 2**10
SMALLER_SPEC = "make the spec's environment, command and mounts smaller"
# How often the streams' credentials are checked (all of a replica's in one query): a revoked
# one's stream ends within this and a poll interval.
REVOCATION_CHECK_S = 2.0


def too_large(what: str, size: int, advice: str = SMALLER_SPEC) -> str:
    return (
        f"{what} {size / 2**20:.1f} MiB, over the {MESSAGE_LIMIT / 2**20:.1f} MiB a "
        f"machine's stream carries: {advice}."
    )


# The protocol revision agents must speak: 2 names workers by id (issue 17); 3 reports how a
# worker ended as a typed cause, not a sentence (issue 22).
PROTOCOL = 3
OLD_AGENT = (
    "This agent speaks an older protocol (it names workers by name, or says how they ended in "
    "sentences): upgrade it to the server's version."
)
OUTAGE_RETRY_START = 0.5  # seconds before a message the database could not take is retried
OUTAGE_RETRY_CAP = 5.0


async def _ending_on_failure(stream: MachineStream, loop: Awaitable[None]) -> None:
    """One of the stream's loops: when it ends, or fails (but for a cancellation), so does
    the stream."""
    try:
        await loop
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("stream of machine %s failed", stream.machine_id)
    finally:
        stream.closed.set()


def _samples(message: agent_pb2.AgentMessage) -> list[SampleIn]:
    return [
        SampleIn(
            s.worker_id,
            s.metric,
            s.gpu if s.HasField("gpu") else None,
            s.at_ms,
            s.value,
            s.attempt or None,
        )
        for s in message.metrics.samples
    ]


def _answered(stream: MachineStream, reply: agent_pb2.Reply) -> None:
    """A reply of the machine's to a request of ours: a followed log's lines, or an answer."""
    follow = stream.follows.get(reply.request_id)
    if follow is not None and reply.WhichOneof("body") == "log":
        follow.offer(reply.log)
        return
    future = stream.pending.get(reply.request_id)
    if future is not None and not future.done():
        future.set_result(reply)


def start_message(command: AgentCommand) -> agent_pb2.StartWorker:
    """A start command's stored payload as the protocol's typed message."""
    p = command.payload
    start = agent_pb2.StartWorker(
        worker=command.worker_name,
        run=str(p.get("run") or ""),
        rank=int(p.get("rank") or 0),
        attempt=int(p.get("attempt") or 0),
        workspace_id=int(p.get("workspace_id") or 0),
        image=str(p.get("image") or ""),
        command=[str(a) for a in p.get("command") or []],
        user=str(p.get("user") or ""),
        working_dir=str(p.get("working_dir") or ""),
        environment={str(k): str(v) for k, v in (p.get("environment") or {}).items()},
        astraeus_environment={
            str(k): str(v) for k, v in (p.get("astraeus_environment") or {}).items()
        },
        mounts=[
            agent_pb2.Mount(
                drive=m["drive"],
                path=m["path"],
                fill_from=m.get("fill_from") or "",
                read_only=bool(m.get("read_only")),
            )
            for m in p.get("mounts") or []
        ],
        credentials=[
            agent_pb2.Credential(
                secret=c["secret"], env=c.get("env") or "", file=c.get("file") or ""
            )
            for c in p.get("credentials") or []
        ],
        gpu_ids=[int(i) for i in p.get("gpu_ids") or []],
    )
    if p.get("cpu") is not None:
        start.cpu = float(p["cpu"])
    if p.get("memory_limit_bytes") is not None:
        start.memory_limit_bytes = int(p["memory_limit_bytes"])
    return start


async def serve(
    service_: AgentService, address: str, credentials: grpc.ServerCredentials | None = None
) -> grpc.aio.Server:
    """The agents' endpoint on ``address``: TLS with ``credentials``, else plaintext (which
    backend/tls.py allows only on loopback or by ASTRAEUS_ALLOW_PLAINTEXT)."""
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(service_, server)
    if credentials is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, credentials)
    await server.start()
    async with service_.db.transaction() as session:
        await machines.grant_restart_grace(session, service_.clock, service_.lease)
    return server
