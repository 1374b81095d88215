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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

from agent import docker, network, rendezvous
from agent import engine as engines
from agent.backoff import Backoff
from agent.commands import CommandHandling
from agent.log_replies import LogReplies
from agent.metrics import unmeasured
from agent.transport import TransportRefused

log = logging.getLogger("astraeus.agent")

BACKOFF_START = 0.5
BACKOFF_CAP = 30.0
BEAT_LOOK_S = 1.0  # how often the heartbeat timer looks whether a beat is due
# Messages that are not kept for resending: of no use on a later stream.
PASSING = {"reply", "heartbeat", "secret_request"}
PROTOCOL = 3  # workers named by id, ends reported as causes (proto Hello.protocol)
# Answers to Connect that another try would get again: the agent stops, saying why.
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
REFUSALS = (
    UNAUTHENTICATED,
    FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
)
# The machine's own credential, from the join token, in its data folder (0600).
CREDENTIAL_FILE = "machine-credential"
CREDENTIAL_PREFIX = "astm_"  # a machine credential (a join token begins astj_)


@dataclass
class Agent(CommandHandling, LogReplies):
    """One agent: its stream to the server over its parts (workers, commands, samples, logs)."""

    # Waits between reconnects: jittered, over again after a session of a minute or more.
    reconnects: Backoff = field(
        default_factory=lambda: Backoff(BACKOFF_START, BACKOFF_CAP, jitter=0.5, reset_after=60)
    )
    # Seconds between heartbeats: the setting, or a third of the server's lease if shorter.
    beat_every: float = 0.0

    async def run_forever(self) -> None:
        """Connect, and connect again after any loss, backing off with jitter."""
        self.adopt()
        if self.config.executor == "docker":
            # Containers of workers this agent no longer has (deleted while it was away).
            with contextlib.suppress(Exception):
                install = self.config.install
                kept = {f"{install}-{k}" for k in self.workers}
                await engines.remove_orphans(self._engine(), kept, install)
        self._start_network()
        sampling = asyncio.create_task(self._sample_forever())
        guarding = asyncio.create_task(self._network_forever())
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
            self.network.stop()  # its table goes with it (a restarted agent makes it anew)
            await docker.removals_done()

    def _start_network(self) -> None:
        """The workloads' network rules (agent/network.py), made as the agent starts, before its
        Hello: ``self.network.enforced`` says whether this machine has them."""
        if self.config.executor != "process" or not self.config.users.switch:
            self.network.why_not = (
                f"the {self.config.executor} executor's workloads are not its processes"
                if self.config.executor != "process"
                else "workloads run as the agent's own user"
            )
            log.warning("network: NOT enforced (%s)", self.network.why_not)
            return
        self.network.start()

    async def _network_forever(self) -> None:
        """The rules brought up to date with the workers taken back and the machine's
        listeners, every network.REFRESH_SECONDS."""
        looks = 0
        while self.network.enforced:
            self._network_rules()
            looks += 1
            if looks % network.SWEEP_EVERY == 0:
                await asyncio.to_thread(network.sweep)  # agents killed since
            await asyncio.sleep(network.REFRESH_SECONDS)

    def _hello(self) -> agent_pb2.AgentMessage:
        c = self.config
        known = [
            agent_pb2.KnownWorker(worker_id=w.worker_id, attempt=w.attempt, ended=w.exited.is_set())
            for w in self.workers.values()
        ]
        known += [
            agent_pb2.KnownWorker(worker_id=worker_id, attempt=attempt, ended=True)
            for worker_id, attempt in self.ended.items()
            if worker_id not in self.workers
        ]
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
                workers=sorted(known, key=lambda k: k.worker_id),
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
        while not self.queue.empty():
            self.queue.get_nowait()
        for message in self.outbox.pending():
            yield message
        while True:
            message = await self.queue.get()
            if message.WhichOneof("body") in PASSING or message.id in self.outbox:
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
                for follow in list(self.follows.values()):
                    follow.cancel()  # the server that asked is gone with its stream

    async def _credential(self, stub: agent_pb2_grpc.AgentStub) -> str:
        """The machine's own credential: kept in the data folder, or got once for the join
        token (a cluster machine token made before credentials joins as one too)."""
        path = self.config.data_dir / CREDENTIAL_FILE
        if path.exists():
            return path.read_text().strip()
        if self.config.token.startswith(CREDENTIAL_PREFIX):
            return self.config.token  # the machine's credential itself, given by hand
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
        """A beat every interval, on a timer of its own whatever else the agent does (the
        server takes any message as a sign of life; a beat says so when nothing else goes).
        The interval is looked at every second: the Welcome may shorten it."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            every = self.beat_every or self.config.heartbeat_seconds
            await asyncio.sleep(max(0.0, min(last + every - loop.time(), BEAT_LOOK_S)))
            if loop.time() - last >= every:
                self._send(durable=False, heartbeat=agent_pb2.Heartbeat())
                last = loop.time()

    async def _handle(self, message: agent_pb2.ServerMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "welcome":
            log.info("joined as machine %s", message.welcome.machine_id)
            if message.welcome.lease_seconds:
                # Back in well within a lease after any outage, the server's included.
                self.reconnects.cap = min(BACKOFF_CAP, message.welcome.lease_seconds / 4)
                # Three beats a lease at least, whatever --heartbeat says.
                self.beat_every = min(
                    self.config.heartbeat_seconds, message.welcome.lease_seconds / 3
                )
        elif kind == "ack":
            self.outbox.acknowledge(message.ack.up_to)
            self.ended = {
                worker_id: attempt
                for worker_id, attempt in self.ended.items()
                if any(_ends(m, worker_id) for m in self.outbox.pending())
            }
        elif kind == "command":
            await self._command(message.command)
            self._send(command_ack=agent_pb2.CommandAck(command_ids=[message.command.command_id]))
        elif kind == "log_tail":
            self._keep(asyncio.create_task(self._reply_tail(message.id, message.log_tail)))
        elif kind == "log_follow_start":
            self._follow(message.id, message.log_follow_start)
        elif kind == "secret_values":
            waiting = self.secret_answers.pop(message.secret_values.worker_id, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(message.secret_values)
        elif kind == "log_follow_stop":
            follow = self.follows.pop(message.log_follow_stop.follow_id, None)
            if follow is not None:
                follow.cancel()


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


def _ends(message: agent_pb2.AgentMessage, worker_id: int) -> bool:
    return (
        message.WhichOneof("body") == "worker_event"
        and message.worker_event.worker_id == worker_id
        and message.worker_event.state == agent_pb2.WORKER_STATE_EXITED
    )
