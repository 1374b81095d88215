"""The agent's side of the stream: connect out, say Hello, carry out commands, report workers.

Every message the agent sends waits in its outbox until the server acknowledges it, and is
sent again after a reconnect, so a server restart loses no state change or failure snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

from agent.executor import Exit, ProcessWorker
from agent.gpus import GpuDevice
from agent.logs import WorkerLog

log = logging.getLogger("astraeus.agent")

BACKOFF_START = 0.5
BACKOFF_CAP = 30.0


@dataclass
class AgentConfig:
    server: str
    token: str
    machine: str
    data_dir: Path
    gpus: list[GpuDevice]
    cpu_cores: float
    memory_bytes: int
    pool: str | None = None
    heartbeat_seconds: float = 10.0


@dataclass
class Agent:
    config: AgentConfig
    workers: dict[str, ProcessWorker] = field(default_factory=dict)
    outbox: dict[int, agent_pb2.AgentMessage] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    queue: asyncio.Queue[agent_pb2.AgentMessage] = field(default_factory=asyncio.Queue)
    running: set[asyncio.Task[None]] = field(default_factory=set)

    def _send(self, **body: Any) -> None:
        message = agent_pb2.AgentMessage(id=next(self.ids), **body)
        self.outbox[message.id] = message
        self.queue.put_nowait(message)

    def report(self, worker: ProcessWorker, state: int, exit: Exit | None = None) -> None:
        event = agent_pb2.WorkerEvent(
            worker=worker.name,
            attempt=worker.attempt,
            state=state,
            at_ms=int(time.time() * 1000),
        )
        if exit is not None:
            event.reason = exit.reason
            if exit.code is not None:
                event.exit_code = exit.code
            if exit.code != 0:
                event.log_tail = worker.log.snapshot()
        self._send(worker_event=event)

    async def run_forever(self) -> None:
        """Connect, and connect again after any loss, backing off with jitter."""
        backoff = BACKOFF_START
        while True:
            started = time.monotonic()
            try:
                await self._session()
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                    raise SystemExit(f"astraeus agent: {error.details()}") from None
                log.warning("stream to %s ended: %s", self.config.server, error.details())
            if time.monotonic() - started > 60:
                backoff = BACKOFF_START
            await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
            backoff = min(backoff * 2, BACKOFF_CAP)

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
                agent_version="0.1.0",
                running_workers=sorted(self.workers),
            ),
        )

    async def _outgoing(self) -> AsyncIterator[agent_pb2.AgentMessage]:
        yield self._hello()
        pending = sorted(self.outbox)
        # What the last stream did not see acknowledged goes again, in order.
        drained = []
        while not self.queue.empty():
            drained.append(self.queue.get_nowait())
        for message_id in pending:
            yield self.outbox[message_id]
        for message in drained:
            if message.id not in self.outbox:
                yield message
        while True:
            yield await self.queue.get()

    async def _session(self) -> None:
        async with grpc.aio.insecure_channel(self.config.server) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            call = stub.Connect(
                self._outgoing(), metadata=(("authorization", f"Bearer {self.config.token}"),)
            )
            beats = asyncio.create_task(self._heartbeats())
            try:
                async for message in call:
                    await self._handle(message)
            finally:
                beats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beats

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_seconds)
            self.queue.put_nowait(
                agent_pb2.AgentMessage(id=next(self.ids), heartbeat=agent_pb2.Heartbeat())
            )

    async def _handle(self, message: agent_pb2.ServerMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "welcome":
            log.info("joined as machine %s", message.welcome.machine_id)
        elif kind == "ack":
            for message_id in [i for i in self.outbox if i <= message.ack.up_to]:
                del self.outbox[message_id]
        elif kind == "command":
            await self._command(message.command)
            self._send(command_ack=agent_pb2.CommandAck(command_ids=[message.command.command_id]))
        elif kind == "log_tail":
            self._reply_tail(message.id, message.log_tail)

    def _reply_tail(self, request_id: int, request: agent_pb2.LogTailRequest) -> None:
        """The last lines of a worker's log, cut to the bytes asked for (its end)."""
        text, archived = WorkerLog(self.config.data_dir / "logs", request.worker).tail(
            request.lines or 1000
        )
        data = text.encode()
        if request.max_bytes and len(data) > request.max_bytes:
            text = data[-request.max_bytes :].decode(errors="ignore")
        reply = agent_pb2.Reply(
            request_id=request_id,
            log=agent_pb2.LogChunk(worker=request.worker, text=text, archived=archived),
        )
        # A reply needs no resending: the server waits for it only so long.
        self.queue.put_nowait(agent_pb2.AgentMessage(id=next(self.ids), reply=reply))

    async def _command(self, command: agent_pb2.Command) -> None:
        name = command.worker
        worker: ProcessWorker | None
        if command.kind == agent_pb2.COMMAND_KIND_START:
            payload = json.loads(command.payload_json or "{}")
            current = self.workers.get(name)
            if current is not None and current.attempt == int(payload.get("attempt", 0)):
                return  # delivered again after a reconnect
            worker = ProcessWorker(name, payload, WorkerLog(self.config.data_dir / "logs", name))
            self.workers[name] = worker
            # Nothing to prepare or pull for a process: straight to the gang barrier.
            self.report(worker, agent_pb2.WORKER_STATE_READY)
        elif command.kind == agent_pb2.COMMAND_KIND_RELEASE:
            worker = self.workers.get(name)
            if worker is not None and worker.process is None and not worker.exited.is_set():
                task = asyncio.create_task(self._run(worker))
                self.running.add(task)
                task.add_done_callback(self.running.discard)
        elif command.kind == agent_pb2.COMMAND_KIND_STOP:
            worker = self.workers.get(name)
            if worker is None:
                return
            if worker.process is None:
                worker.exited.set()
                self.report(
                    worker, agent_pb2.WORKER_STATE_EXITED, Exit(None, "Stopped before it started")
                )
                del self.workers[name]
            else:
                await worker.stop()
        elif command.kind == agent_pb2.COMMAND_KIND_DELETE:
            worker = self.workers.pop(name, None)
            if worker is not None:
                await worker.stop()
            WorkerLog(self.config.data_dir / "logs", name).delete()

    async def _run(self, worker: ProcessWorker) -> None:
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0)
        self.report(worker, agent_pb2.WORKER_STATE_RUNNING)
        exit = await task
        worker.exited.set()
        self.report(worker, agent_pb2.WORKER_STATE_EXITED, exit)
        worker.log.archive()
        worker.release()
        if self.workers.get(worker.name) is worker:
            del self.workers[worker.name]
