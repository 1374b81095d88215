"""The gRPC side of the agent protocol: one ``Connect`` stream per machine.

The agent opens the stream (the server never dials a machine) and says Hello; the server
answers Welcome. From then on the agent's messages are applied in order and acknowledged by
id (backend/gateway/writer.py), and the machine's unacknowledged commands (the outbox the
lifecycle writes) are delivered (backend/gateway/delivery.py). A second stream from the same
machine replaces the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import grpc
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc
from sqlalchemy.exc import TimeoutError as PoolTimeout

from backend.access.rules import bearer_secret
from backend.clock import Clock
from backend.code import service as code
from backend.db import Database
from backend.db.notices import Notices
from backend.db.retries import database_away
from backend.errors import DatabaseUnavailable, Unauthenticated
from backend.gateway import service
from backend.gateway.delivery import POLL_S, CommandDelivery, command_message
from backend.gateway.follow_buffer import FollowBuffer, LogChunkInfo
from backend.gateway.handlers import MessageHandlers
from backend.gateway.leases import LeaseKeeper, renew_interval
from backend.gateway.seen_lines import SeenLines
from backend.gateway.service import HelloInfo, KnownWorker
from backend.gateway.streams import MachineStream, StreamHook, Streams
from backend.gateway.writer import MessageWriter, report_refusal
from backend.logs.service import LogText, WorkerRef
from backend.machine_identity import service as identity
from backend.machine_identity.rules import MachinePrincipal
from backend.machines import rules as machine_rules
from backend.machines import service as machines
from backend.machines.service import GpuInfo

log = logging.getLogger(__name__)


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
        isolation=_isolation(hello),
    )


def _isolation(hello: agent_pb2.Hello) -> dict[str, Any] | None:
    """What of its workers' sandbox the agent enforces, by the parts' names; None from an
    agent before it (it says no part, and no limit). Parts this server does not know are
    left out."""
    if not hello.isolation and not hello.workload_pids_max:
        return None
    known = set(agent_pb2.Isolation.values()) - {agent_pb2.ISOLATION_UNSPECIFIED}
    parts = {
        agent_pb2.Isolation.Name(n).removeprefix("ISOLATION_").lower()
        for n in hello.isolation
        if n in known
    }
    return {"enforced": sorted(parts), "pids_max": int(hello.workload_pids_max)}


class AgentService(agent_pb2_grpc.AgentServicer):
    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        lease: timedelta,
        poll_interval: float = POLL_S,
        on_freed: Callable[[], None] = lambda: None,
        on_stream: StreamHook | None = None,
        renew_interval_s: float | None = None,
        notices: Notices | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.lease = lease
        self.on_freed = on_freed
        self.streams = Streams(on_stream)
        # One loop for all this replica's streams: their new commands and whether their
        # credentials still hold, a query or two per poll however many streams there are.
        self.delivery = CommandDelivery(
            db, clock, self.streams, poll_interval=poll_interval, on_freed=on_freed, notices=notices
        )
        # The machines' messages, written by a few writers for all the streams.
        self.writer = MessageWriter(db, clock, MessageHandlers(clock, self.streams), on_freed)
        # The last lines relayed of each worker: a lost machine's snapshots (issue 36).
        self.seen = SeenLines()
        self.leases = LeaseKeeper(
            db,
            clock,
            lease,
            interval=renew_interval_s or renew_interval(lease),
            backlogged=self._backlogged,
            lost=self._lost,
            seen=self.seen,
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
                refusal = await identity.registration_refusal(
                    session, agent, info.machine
                ) or await machines.executor_refusal(session, agent.cluster_id, info.executor)
                if refusal is None:
                    await identity.mark_used(session, self.clock, agent)
                    machine = await service.hello(session, self.clock, agent, info, self.lease)
                    to_stop, fx = await service.reconcile(
                        session, self.clock, machine, info.workers
                    )
                    watches = await service.watches(session, machine)
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
        self.seen.opened(machine.id)
        self.leases.start()
        log.info("machine %s connected", machine.name)
        stream.send(
            welcome=agent_pb2.Welcome(
                machine_id=machine.id,
                lease_seconds=int(self.lease.total_seconds()),
                protocol=SERVER_PROTOCOL,
            )
        )
        stream.send(ack=agent_pb2.Ack(up_to=first.id))
        for worker_id in to_stop:  # not this machine's any more: no command row to keep
            stream.send(
                command=agent_pb2.Command(kind=agent_pb2.COMMAND_KIND_STOP, worker_id=worker_id)
            )
        for watch in watches:  # acknowledged before, perhaps: the agent knows them no more
            stream.send(command=command_message(watch))
        tasks = [
            asyncio.create_task(_ending_on_failure(stream, self._read(stream, request_iterator))),
            asyncio.create_task(_ending_on_failure(stream, self.writer.write(stream, machine))),
        ]
        self.delivery.soon()
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
            if self.streams.get(machine.id) is None:  # not replaced by a newer stream
                self.seen.closed(machine.id)
            if not self.streams.by_machine:
                self.delivery.stop()
                self.writer.stop()
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
        if not reply.log.archived:  # an archived log is an earlier attempt's
            self.seen.tail(machine_id, worker.id, reply.log.text, self.clock.now())
        return LogText(worker=worker.name, text=reply.log.text, archived=reply.log.archived)

    async def follow(
        self, machine_id: int, worker: WorkerRef, tail_lines: int = 0
    ) -> AsyncGenerator[LogChunkInfo, None]:
        """A worker's new log lines as its machine writes them, until it ends.

        Begins with its last ``tail_lines`` lines. Ends when the worker does (the last chunk
        says ``ended``), or quietly when the machine's stream goes; the caller closing the
        generator (``contextlib.aclosing``) sends the machine LogFollowStop.
        """
        stream = self.streams.get(machine_id)
        if stream is None:
            return
        request_id = next(stream.ids)
        follow = FollowBuffer()
        stream.follows[request_id] = follow
        stream.outgoing.put_nowait(
            agent_pb2.ServerMessage(
                id=request_id,
                log_follow_start=agent_pb2.LogFollowStart(
                    worker_id=worker.id, follow_id=str(request_id), tail_lines=tail_lines
                ),
            )
        )
        seen = self.seen.tail  # its first lines are the log's last; then new ones follow them
        try:
            while True:
                chunk = follow.take()
                if chunk is None:
                    if stream.closed.is_set():  # closed, and all that came first was read
                        return
                    await _first_set(follow.arrived, stream.closed)
                    continue
                if not chunk.archived:
                    seen(machine_id, worker.id, chunk.text, self.clock.now())
                    seen = self.seen.follow
                yield chunk
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
            await _unavailable_if_away(context, error)
            raise
        log.info("machine %s joined with a join token", request.machine)
        return agent_pb2.JoinReply(credential=issued.secret, machine=request.machine)

    async def FetchCode(
        self, request: agent_pb2.CodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.CodeChunk]:
        """A run's code, a chunk a message, to the machine of one of its workers (issue 41):
        the machine named in the request, if the credential may speak for it (as at a Hello),
        holding the worker at this attempt, whose run ships with this digest. Anything else is
        NOT_FOUND, the same answer whether the code exists elsewhere or nowhere."""
        agent = await self._authenticate(context)
        try:
            async with self.db.read() as session:
                archive = None
                refusal = await identity.registration_refusal(session, agent, request.machine)
                machine_id = await machines.machine_id(session, agent.cluster_id, request.machine)
                if refusal is None and machine_id is not None:
                    archive = await code.for_machine(
                        session, machine_id, request.worker_id, request.attempt, request.digest
                    )
                found = None if archive is None else (archive.id, archive.chunks)
                total = 0 if archive is None else archive.archive_bytes
        except Exception as error:
            await _unavailable_if_away(context, error)
            raise
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, NO_CODE)
        assert found is not None
        archive_id, chunks = found
        for seq in range(chunks):  # a short read a chunk: a slow machine holds no connection
            try:
                async with self.db.read() as session:
                    data = await code.chunk(session, archive_id, seq)
            except Exception as error:
                await _unavailable_if_away(context, error)
                raise
            if data is None:  # pruned meanwhile
                await context.abort(grpc.StatusCode.NOT_FOUND, NO_CODE)
            yield agent_pb2.CodeChunk(data=data, archive_bytes=total)

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> MachinePrincipal:
        try:
            async with self.db.read() as session:
                return await identity.authenticate(session, _bearer(context))
        except Unauthenticated as error:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, error.message)
            raise  # abort raises; this keeps type checkers sure
        except Exception as error:
            await _unavailable_if_away(context, error)
            raise

    async def _read(
        self, stream: MachineStream, request_iterator: AsyncIterator[agent_pb2.AgentMessage]
    ) -> None:
        """Take the machine's messages as they come: each says the machine is alive (its
        lease is renewed with the others', backend/gateway/leases.py); replies (log lines
        asked for) are answered at once, database or not; every message goes on to the
        writer."""
        async for message in request_iterator:
            self.leases.note(stream.machine_id)
            if message.WhichOneof("body") == "reply":
                _answered(stream, message.reply)
            refusal = report_refusal(message)
            if refusal is not None:
                log.warning("machine %s: %s", stream.machine_id, refusal)
                message = agent_pb2.AgentMessage(id=message.id, heartbeat=agent_pb2.Heartbeat())
            await stream.received.put(message)

    @property
    def idle(self) -> bool:
        """No stream, no batch being written, no lease renewal left (a server stopped)."""
        return not self.streams.by_machine and not self.writer.writing and self.leases.idle

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

    def close_streams(self) -> None:
        """The server is stopping: every stream ends now (its agent reconnects, to this
        replica once it is back or to another), rather than each waiting out the gRPC
        server's grace."""
        for stream in list(self.streams.by_machine.values()):
            stream.closed.set()


async def _unavailable_if_away(context: grpc.aio.ServicerContext, error: Exception) -> None:
    """The call aborted UNAVAILABLE (the agent tries again later) when ``error`` is the
    database's: its pool full, or the database away; any other error is left to the caller."""
    if isinstance(error, PoolTimeout):
        await context.abort(grpc.StatusCode.UNAVAILABLE, BUSY)
    if database_away(error):
        await context.abort(grpc.StatusCode.UNAVAILABLE, DatabaseUnavailable().message)


def _bearer(context: grpc.aio.ServicerContext) -> str | None:
    metadata = dict(context.invocation_metadata() or ())
    return bearer_secret(str(metadata.get("authorization", "")))


NO_CODE = "No such code for a worker of this machine at this attempt."
REGISTRATION_FAILED = "The server could not register this machine; its log says why."
BUSY = "The server is busy (no database connection free in time): try again shortly."


# The protocol revision agents must speak: 2 names workers by id (issue 17); 3 reports how a
# worker ended as a typed cause, not a sentence (issue 22).
PROTOCOL = 3
# The revision the server speaks, told in the Welcome: 4 takes a Report (a sample period's
# progress and samples in one message, issue 40); an agent sends one only to such a server.
SERVER_PROTOCOL = 4
OLD_AGENT = (
    "This agent speaks an older protocol (it names workers by name, or says how they ended in "
    "sentences): upgrade it to the server's version."
)


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


def _answered(stream: MachineStream, reply: agent_pb2.Reply) -> None:
    """A reply of the machine's to a request of ours: a followed log's lines, or an answer."""
    follow = stream.follows.get(reply.request_id)
    if follow is not None and reply.WhichOneof("body") == "log":
        chunk = reply.log
        follow.offer(LogChunkInfo(chunk.text, chunk.archived, chunk.missed_lines, chunk.ended))
        return
    future = stream.pending.get(reply.request_id)
    if future is not None and not future.done():
        future.set_result(reply)


async def _first_set(*events: asyncio.Event) -> None:
    """Until one of the events is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


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
