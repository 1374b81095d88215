"""The agent's side of the stream: connect out, say Hello, hand the server's messages to the
agent's parts, beat, and connect again after any loss.

What the last stream (or agent) did not see acknowledged is sent again on the next one, from
the outbox on disk (agent/outbox.py), so neither a server restart nor an agent restart loses a
state change, a failure snapshot, or what the agent measured while the server was away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import grpc
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

from agent import commands, docker, rendezvous
from agent.backoff import Backoff
from agent.config import CREDENTIAL_FILE, AgentConfig
from agent.log_replies import Followed, LogReplies
from agent.metrics import SampledWorker, unmeasured
from agent.outbox import Outbox
from agent.sampling import Sampling
from agent.slurm_watch import SlurmWatch
from agent.state import Background, Outgoing, isolation, private_folders
from agent.transport import TransportRefused
from agent.workers import Workers

log = logging.getLogger("astraeus.agent")

BACKOFF_START = 0.5
BACKOFF_CAP = 30.0
BEAT_LOOK_S = 1.0  # how often the heartbeat timer looks whether a beat is due
# Messages that are not kept for resending: of no use on a later stream.
PASSING = {"reply", "heartbeat", "secret_request"}
# Workers named by id, ends reported as causes, a sample period's reports as one Report to a
# server that takes it (proto Hello.protocol, Welcome.protocol).
PROTOCOL = 4
REPORTS_FROM = 4  # the server's revision that takes a Report
# Answers to Connect that another try would get again: the agent stops, saying why.
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
REFUSALS = (
    UNAUTHENTICATED,
    FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
)


class Agent:
    """One agent: its stream to the server, and the parts it hands the server's messages to,
    each made here with what it needs: its workers, its watch of what Slurm runs, its log
    replies, its sampling; all saying what they have to through one ``outgoing``."""

    def __init__(self, config: AgentConfig) -> None:
        private_folders(config.data_dir, config.workload_dir)
        self.config = config
        self.outgoing = Outgoing(Outbox(config.data_dir / "outbox"))
        self.background = Background()
        self.isolation = isolation(config)
        self.sampling = Sampling(config, self.outgoing, self._kept)
        self.logs = LogReplies(config.log_root, self.outgoing, self.background, self._find)
        self.workers = Workers(
            config, self.outgoing, self.background, self.sampling, self.logs, self.isolation
        )
        self.slurm = SlurmWatch(config, self.outgoing, self.background, self.sampling, self.logs)
        self.commands = commands.for_executor(
            config.executor, self.workers.commands(), self.slurm.commands(), self.slurm.ignore
        )
        # Waits between reconnects: jittered, over again after a session of a minute or more.
        self.reconnects = Backoff(BACKOFF_START, BACKOFF_CAP, jitter=0.5, reset_after=60)
        # Seconds between heartbeats: the setting, or a third of the server's lease if shorter.
        self.beat_every = 0.0
        # The server's messages, by kind, to what carries each out.
        self.handlers: dict[str, Callable[[agent_pb2.ServerMessage], Awaitable[None]]] = {
            "welcome": self._welcome,
            "ack": self._ack,
            "command": self._command,
            "log_tail": self._log_tail,
            "log_follow_start": self._log_follow_start,
            "log_follow_stop": self._log_follow_stop,
            "secret_values": self._secret_values,
        }

    def _kept(self) -> Sequence[SampledWorker]:
        """What is sampled: the workers kept, and those watched."""
        return [*self.workers.by_id.values(), *self.slurm.watched.values()]

    def _find(self, worker_id: int) -> Followed | None:
        return self.workers.by_id.get(worker_id) or self.slurm.watched.get(worker_id)

    async def run_forever(self) -> None:
        """Connect, and connect again after any loss, backing off with jitter."""
        self.workers.adopt()
        await self.workers.remove_orphans()
        self.workers.start_network()
        sampling = asyncio.create_task(self.sampling.forever())
        guarding = asyncio.create_task(self.workers.network_forever())
        try:
            while True:
                started = time.monotonic()
                try:
                    await self._session()
                except grpc.aio.AioRpcError as error:
                    if error.code() in REFUSALS:
                        raise SystemExit(f"astraeus agent: {error.details()}") from None
                    log.warning("stream to %s ended: %s", self.config.server, error.details())
                await asyncio.sleep(self.reconnects.wait(time.monotonic() - started))
        finally:
            sampling.cancel()
            guarding.cancel()
            self.workers.network.stop()  # its table goes with it (a restarted agent makes it anew)
            await docker.removals_done()

    def _hello(self) -> agent_pb2.AgentMessage:
        c = self.config
        return agent_pb2.AgentMessage(
            id=0,
            hello=agent_pb2.Hello(
                machine=c.machine,
                pool=c.pool or "",
                cpu_cores=c.cpu_cores,
                memory_bytes=c.memory_bytes,
                gpus=[
                    agent_pb2.Gpu(
                        index=g.index,
                        uuid=g.uuid,
                        model=g.model,
                        memory_bytes=g.memory_bytes,
                        healthy=g.healthy,
                        health_reason=g.health_reason,
                    )
                    for g in c.gpus
                ],
                executor=c.executor,
                unmeasured_metrics=unmeasured(c.executor),
                agent_version="0.2.0",
                protocol=PROTOCOL,
                advertise_address=(c.advertise_address or rendezvous.route_address(c.server)),
                workers=self.workers.known(),
                isolation=[
                    agent_pb2.Isolation.Value(f"ISOLATION_{part.upper()}")
                    for part in sorted(self.isolation.enforced)
                ],
                workload_pids_max=self.isolation.pids_max,
            ),
        )

    async def _outgoing(self) -> AsyncIterator[agent_pb2.AgentMessage]:
        yield self._hello()
        # What the last stream (or agent) did not see acknowledged goes again, in order;
        # passing messages queued meanwhile (heartbeats, replies) are of no use any more.
        queue, outbox = self.outgoing.queue, self.outgoing.outbox
        while not queue.empty():
            queue.get_nowait()
        for message in outbox.pending():
            yield message
        while True:
            message = await queue.get()
            if message.WhichOneof("body") in PASSING or message.id in outbox:
                yield message

    async def _session(self) -> None:
        try:
            opened = self.config.transport.channel(self.config.server)
        except TransportRefused as refused:
            raise SystemExit(str(refused)) from None
        async with opened as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            credential = await self._credential(stub)
            call = stub.Connect(
                self._outgoing(), metadata=(("authorization", f"Bearer {credential}"),)
            )
            beats = asyncio.create_task(self._heartbeats())
            try:
                async for message in call:
                    await self._handle(message)
            finally:
                beats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beats
                self.logs.stop_all()  # the server that asked is gone with its stream

    async def _credential(self, stub: agent_pb2_grpc.AgentStub) -> str:
        """The machine's own credential: kept in the data folder, or got once for the join
        token (a cluster machine token made before credentials joins as one too)."""
        kept = self.config.kept_credential()
        if kept is not None:
            return kept  # joined before, or the machine's credential itself, given by hand
        path = self.config.data_dir / CREDENTIAL_FILE
        if not self.config.token:
            raise SystemExit(
                f"astraeus agent: {path} is missing and no join token was given (--token, "
                "--token-file or ASTRAEUS_AGENT_TOKEN)"
            )
        reply = await stub.Join(
            agent_pb2.JoinRequest(machine=self.config.machine),
            metadata=(("authorization", f"Bearer {self.config.token}"),),
        )
        keep_secret(path, reply.credential)
        log.info("machine %s has its own credential now, kept in %s", reply.machine, path)
        return str(reply.credential)

    async def _heartbeats(self) -> None:
        """A beat after every interval in which nothing else went, on a timer of its own
        whatever else the agent does: the server takes any message as a sign of life, so a
        machine whose workers report every few seconds sends no beats (issue 40: a fifth of a
        busy fleet's messages). The interval is looked at every second: the Welcome may shorten
        it."""
        last = time.monotonic()
        while True:
            every = self.beat_every or self.config.heartbeat_seconds
            heard = max(last, self.outgoing.sent_at)
            await asyncio.sleep(max(0.0, min(heard + every - time.monotonic(), BEAT_LOOK_S)))
            if time.monotonic() - max(last, self.outgoing.sent_at) >= every:
                self.outgoing.send(durable=False, heartbeat=agent_pb2.Heartbeat())
                last = time.monotonic()

    async def _handle(self, message: agent_pb2.ServerMessage) -> None:
        handler = self.handlers.get(message.WhichOneof("body") or "")
        if handler is not None:
            await handler(message)

    async def _welcome(self, message: agent_pb2.ServerMessage) -> None:
        log.info("joined as machine %s", message.welcome.machine_id)
        # A server older than 4 would drop a Report: its reports go apart, as it knows them.
        self.outgoing.takes_reports = message.welcome.protocol >= REPORTS_FROM
        if message.welcome.lease_seconds:
            # Back in well within a lease after any outage, the server's included.
            self.reconnects.cap = min(BACKOFF_CAP, message.welcome.lease_seconds / 4)
            # Three beats a lease at least, whatever --heartbeat says.
            self.beat_every = min(self.config.heartbeat_seconds, message.welcome.lease_seconds / 3)

    async def _ack(self, message: agent_pb2.ServerMessage) -> None:
        self.outgoing.outbox.acknowledge(message.ack.up_to)
        self.workers.acknowledged(list(self.outgoing.outbox.pending()))

    async def _command(self, message: agent_pb2.ServerMessage) -> None:
        await self.commands.carry_out(message.command)
        ack = agent_pb2.CommandAck(command_ids=[message.command.command_id])
        self.outgoing.send(command_ack=ack)

    async def _log_tail(self, message: agent_pb2.ServerMessage) -> None:
        self.logs.tail(message.id, message.log_tail)

    async def _log_follow_start(self, message: agent_pb2.ServerMessage) -> None:
        self.logs.follow(message.id, message.log_follow_start)

    async def _log_follow_stop(self, message: agent_pb2.ServerMessage) -> None:
        self.logs.stop(message.log_follow_stop.follow_id)

    async def _secret_values(self, message: agent_pb2.ServerMessage) -> None:
        self.workers.preparation.answered(message.secret_values)


async def until_stopped(agent: Agent) -> None:
    """The agent until SIGTERM (a stop, `astraeus up` ending it) or SIGINT: both end it as a
    cancel does, its own table of network rules removed (agent/network.py)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for stop in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(stop, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await agent.run_forever()


def keep_secret(path: Path, secret: str) -> None:
    """Write a secret readable by this user alone (0600), whole or not at all."""
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secret + "\n")
        file.flush()
        os.fsync(file.fileno())
    partial.replace(path)
