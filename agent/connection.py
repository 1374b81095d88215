"""The agent's side of the stream: connect out, say Hello, carry out commands, report workers.

Every message the agent sends waits in its outbox (on disk for what must not be lost) until
the server acknowledges it, and is sent again after a reconnect or a restart, so neither a
server restart nor an agent restart loses a state change or a failure snapshot. Workers are
kept by shims that outlive the agent; a restarted agent takes them back (``adopt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc

from agent import docker, prepare, rendezvous
from agent import engine as engines
from agent.backoff import Backoff
from agent.executor import OOM_KILLED, EndCause, Exit, ProcessWorker
from agent.gpus import GpuDevice, NvmlSampler
from agent.identity import WorkloadUsers, workload_dir
from agent.logs import LogFollower, WorkerLog
from agent.metrics import Sampler, unmeasured
from agent.outbox import Outbox
from agent.transport import Transport, TransportRefused

log = logging.getLogger("astraeus.agent")

Worker = ProcessWorker | docker.ContainerWorker

BACKOFF_START = 0.5
BACKOFF_CAP = 30.0
BEAT_LOOK_S = 1.0  # how often the heartbeat timer looks whether a beat is due
FOLLOW_POLL_S = 0.2
# A worker's first samples wait for its process to join its group (agent/enter.py does, as
# its first step: milliseconds, longer on a loaded machine), looking this often, this long.
START_SAMPLE_POLL_S = 0.02
START_SAMPLE_WAIT_S = 2.0
# Messages that are not kept for resending: of no use on a later stream.
PASSING = {"reply", "heartbeat", "secret_request"}
# A follower waits while this many messages are queued for the server (it skips ahead later).
QUEUE_HIGH_WATER = 256
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
class AgentConfig:
    server: str
    token: str
    machine: str
    data_dir: Path
    gpus: list[GpuDevice]
    cpu_cores: float
    memory_bytes: int
    pool: str | None = None
    # Where other machines reach this one (gangs' MASTER_ADDR); empty: the local address of
    # the connection to the server (agent/rendezvous.py).
    advertise_address: str = ""
    heartbeat_seconds: float = 10.0
    sample_seconds: float = 5.0
    prepare_poll_seconds: float = 2.0
    executor: str = "process"  # or "docker": containers through the Docker Engine API
    docker_socket: str = engines.SOCKET
    nvml: NvmlSampler | None = None
    # Who workloads run as (agent/identity.py), and what of the machine they may reach:
    # folders drives may be filled from, folders mount paths may be linked in (none: only
    # under the worker's own folder).
    users: WorkloadUsers = field(default_factory=WorkloadUsers)
    fill_roots: tuple[Path, ...] = ()
    mount_roots: tuple[Path, ...] = ()
    # TLS to the server, or plaintext on loopback only (agent/transport.py).
    transport: Transport = field(default_factory=Transport)

    @property
    def install(self) -> str:
        """Names this agent's data folder: two agents on one machine share no control group."""
        return hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:12]

    @property
    def workload_dir(self) -> Path:
        """Where the workers' folders and the drives are (agent/identity.py)."""
        return workload_dir(self.data_dir, self.users)


@dataclass
class Agent:
    config: AgentConfig
    # Everything of a worker on this machine is keyed by the server's id for it, never its
    # name: two workspaces may both run `train` here.
    workers: dict[int, Worker] = field(default_factory=dict)
    queue: asyncio.Queue[agent_pb2.AgentMessage] = field(default_factory=asyncio.Queue)
    running: set[asyncio.Task[Any]] = field(default_factory=set)
    follows: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    ended: dict[int, int] = field(default_factory=dict)  # reported ends not yet acknowledged
    preparing: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    secret_answers: dict[int, asyncio.Future[agent_pb2.SecretValues]] = field(default_factory=dict)
    # Waits between reconnects: jittered, over again after a session of a minute or more.
    reconnects: Backoff = field(
        default_factory=lambda: Backoff(BACKOFF_START, BACKOFF_CAP, jitter=0.5, reset_after=60)
    )
    # Seconds between heartbeats: the setting, or a third of the server's lease if shorter.
    beat_every: float = 0.0
    # Rank 0's MASTER_PORT: bound from its START until its process starts, claimed machine-wide
    # until the worker is gone (agent/rendezvous.py).
    reserved: dict[int, rendezvous.Claim] = field(default_factory=dict)
    outbox: Outbox = field(init=False)
    sampler: Sampler = field(init=False)

    def __post_init__(self) -> None:
        private_folders(self.config.data_dir, self.config.workload_dir)
        self.outbox = Outbox(self.config.data_dir / "outbox")
        self.sampler = Sampler(
            self.config.nvml, gpu_memory={g.index: g.memory_bytes for g in self.config.gpus}
        )

    @property
    def log_root(self) -> Path:
        return self.config.data_dir / "logs"

    @property
    def worker_root(self) -> Path:
        return self.config.workload_dir / "workers"

    @property
    def drive_root(self) -> Path:
        return self.config.workload_dir / "drives"

    def _send(self, durable: bool = True, **body: Any) -> None:
        """Queue a message; kept in the outbox until acknowledged unless it is a passing one."""
        message = agent_pb2.AgentMessage(id=self.outbox.next_id(), **body)
        if durable:
            self.outbox.put(message)
        self.queue.put_nowait(message)

    def report(
        self,
        worker: Worker,
        state: int,
        exit: Exit | None = None,
        *,
        waits: tuple[agent_pb2.Wait.ValueType, str] | None = None,
        detail: str = "",
    ) -> None:
        """A change of ``worker``: its end (``exit``), or while it prepares or pulls what it
        waits for, named (and how far, in ``detail``); the server writes the sentences."""
        event = agent_pb2.WorkerEvent(
            worker_id=worker.worker_id,
            attempt=worker.attempt,
            state=state,
            # An end is dated when its process ended (the shim's record), not when seen here.
            at_ms=exit.at_ms if exit is not None and exit.at_ms else int(time.time() * 1000),
            detail=detail,
        )
        if waits is not None:
            event.waits_for, event.waits_on = waits
        if exit is not None:
            event.cause = agent_pb2.EndCause.Value(f"END_CAUSE_{exit.cause.upper()}")
            event.detail = exit.detail
            if exit.signal is not None:
                event.signal = exit.signal
            if exit.code is not None:
                event.exit_code = exit.code
            # A failure's snapshot; and a stop's: the server keeps it when it stopped the
            # worker for its time limit, a preemption or a stall, or had lost its machine.
            if exit.code != 0 or worker.stopping:
                event.log_tail = worker.log.snapshot()
        self._send(worker_event=event)

    # --- executors ------------------------------------------------------------------------

    def _new_worker(self, worker_id: int, payload: dict[str, Any]) -> Worker:
        log_ = WorkerLog(self.log_root, str(worker_id))
        folder = self.worker_root / str(worker_id)
        if self.config.users.switch:  # a user id of its own, free among the kept workers
            taken = {int(w.payload["uid"]) for w in self.workers.values() if "uid" in w.payload}
            with contextlib.suppress(LookupError):  # none free: start() says so
                payload = {**payload, "uid": self.config.users.free_uid(taken)}
        if self.config.executor == "docker":
            drives = prepare.drive_folder(self.drive_root, payload, "x").parent
            container = docker.ContainerWorker(
                worker_id, payload, log_, folder, engine=self._engine(), drives=drives
            )
            container.users, container.install = self.config.users, self.config.install
            return container
        return self._process_worker(
            ProcessWorker(worker_id, payload, log_, folder, drive_root=self.drive_root)
        )

    def _process_worker(self, worker: ProcessWorker) -> ProcessWorker:
        c = self.config
        worker.users, worker.install = c.users, c.install
        worker.fill_roots, worker.mount_roots = c.fill_roots, c.mount_roots
        return worker

    def _adopt_worker(self, folder: Path) -> Worker | None:
        if docker.is_container_folder(folder):
            adopted = docker.ContainerWorker.adopt(folder, self.log_root, self._engine())
            if adopted is not None:
                adopted.drives = prepare.drive_folder(self.drive_root, adopted.payload, "x").parent
                adopted.users, adopted.install = self.config.users, self.config.install
            return adopted
        process = ProcessWorker.adopt(folder, self.log_root)
        if process is not None:
            process.drive_root = self.drive_root
            self._process_worker(process)
        return process

    def _engine(self) -> engines.Engine:
        return engines.engine_at(self.config.docker_socket)

    # --- starting up ----------------------------------------------------------------------

    def adopt(self) -> None:
        """Take back the workers a previous agent left: running, at the barrier, or ended."""
        if not self.worker_root.exists():
            return
        for folder in sorted(p for p in self.worker_root.iterdir() if p.is_dir()):
            worker = self._adopt_worker(folder)
            if worker is None:
                continue
            self.workers[worker.worker_id] = worker
            if worker.started:
                self._watch(worker)
            else:
                self._begin(worker)  # at the barrier: credentials and drives again
            log.info("took back worker %s (attempt %s)", worker.name, worker.attempt)

    async def run_forever(self) -> None:
        """Connect, and connect again after any loss, backing off with jitter."""
        self.adopt()
        if self.config.executor == "docker":
            # Containers of workers this agent no longer has (deleted while it was away).
            with contextlib.suppress(Exception):
                install = self.config.install
                kept = {f"{install}-{k}" for k in self.workers}
                await engines.remove_orphans(self._engine(), kept, install)
        sampling = asyncio.create_task(self._sample_forever())
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
            await docker.removals_done()

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

    # --- logs -----------------------------------------------------------------------------

    def _reply(self, request_id: int, chunk: agent_pb2.LogChunk) -> None:
        # A reply needs no resending: the server waits for it only so long.
        self._send(durable=False, reply=agent_pb2.Reply(request_id=request_id, log=chunk))

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self.running.add(task)
        task.add_done_callback(self.running.discard)

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
        worker = self.workers.get(key)
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
        while not worker.exited.is_set():
            if self.queue.qsize() < QUEUE_HIGH_WATER:
                text, skipped = await asyncio.to_thread(follower.read)
                missed += skipped
                if text or missed:
                    self._reply(
                        request_id,
                        agent_pb2.LogChunk(worker_id=key, text=text, missed_lines=missed),
                    )
                    missed = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.exited.wait(), FOLLOW_POLL_S)
        rest = await asyncio.to_thread(follower.rest)
        self._reply(request_id, agent_pb2.LogChunk(worker_id=key, text=rest, ended=True))

    # --- commands -------------------------------------------------------------------------

    async def _command(self, command: agent_pb2.Command) -> None:
        key = command.worker_id
        worker: Worker | None
        if not key:
            return  # names no worker (a command of a server before ids): nothing to do
        if command.kind == agent_pb2.COMMAND_KIND_START:
            payload = start_payload(command.start)
            current = self.workers.get(key)
            if current is not None and current.attempt == int(payload.get("attempt", 0)):
                return  # delivered again after a reconnect
            if current is not None:
                await current.stop()
            self._release_master_port(key)
            worker = self._new_worker(key, payload)
            worker.keep()
            self.workers[key] = worker
            if not self._reserve_master_port(worker):
                return
            self._begin(worker)
        elif command.kind == agent_pb2.COMMAND_KIND_RELEASE:
            worker = self.workers.get(key)
            if worker is not None and not worker.started and not worker.exited.is_set():
                self._master_port_started(key)  # the worker's process binds it now
                await worker.start()
                self.report(worker, agent_pb2.WORKER_STATE_RUNNING)
                self._watch(worker)
                self._keep(asyncio.create_task(self._sample_start(worker)))
        elif command.kind == agent_pb2.COMMAND_KIND_STOP:
            worker = self.workers.get(key)
            if worker is None:
                return
            if not worker.started:
                preparing = self.preparing.pop(key, None)
                if preparing is not None:
                    preparing.cancel()
                worker.exited.set()
                self.report(
                    worker, agent_pb2.WORKER_STATE_EXITED, Exit(None, EndCause.STOPPED_BEFORE_START)
                )
                self._forget(worker)
            else:
                await worker.stop()
        elif command.kind == agent_pb2.COMMAND_KIND_DELETE:
            preparing = self.preparing.pop(key, None)
            if preparing is not None:
                preparing.cancel()
            worker = self.workers.pop(key, None)
            self._release_master_port(key)
            if worker is not None:
                await worker.stop()
                worker.release()
            WorkerLog(self.log_root, str(key)).delete()

    def _reserve_master_port(self, worker: Worker) -> bool:
        """Rank 0 of a gang holds its MASTER_PORT until it starts; a port another program
        holds ends the start, saying so (the next placement asks for another one)."""
        environment = worker.payload.get("astraeus_environment") or {}
        if environment.get("RANK") != "0" or int(environment.get("WORLD_SIZE") or 1) < 2:
            return True
        port = int(environment.get("MASTER_PORT") or 0)
        if not port:
            return True
        held = rendezvous.claim(port)
        if held is None:
            reason = rendezvous.port_taken_reason(port, self.config.machine)
            self._ended_before_start(worker, Exit(None, EndCause.NOT_STARTED, detail=reason))
            return False
        self.reserved[worker.worker_id] = held
        return True

    def _master_port_started(self, worker_id: int) -> None:
        """Its process binds the port now: the sockets go, the machine-wide claim stays."""
        held = self.reserved.get(worker_id)
        if held is not None:
            held.started()

    def _release_master_port(self, worker_id: int) -> None:
        held = self.reserved.pop(worker_id, None)
        if held is not None:
            held.end()

    # --- preparing: credentials and drives --------------------------------------------------

    def _begin(self, worker: Worker) -> None:
        """Prepare what the worker needs, then wait at the gang barrier (READY)."""
        nothing_to_do = not worker.payload.get("credentials") and not prepare.drives_to_fill(
            worker.payload, self.drive_root
        )
        if nothing_to_do and isinstance(worker, ProcessWorker):
            self.report(worker, agent_pb2.WORKER_STATE_READY)
            return
        task = asyncio.create_task(self._prepare(worker))
        self.preparing[worker.worker_id] = task
        task.add_done_callback(lambda _: self.preparing.pop(worker.worker_id, None))

    async def _prepare(self, worker: Worker) -> None:
        said: tuple[agent_pb2.Wait.ValueType, str] | None = None

        def preparing(wait: agent_pb2.Wait.ValueType, name: str) -> None:
            nonlocal said
            if (wait, name) != said:
                said = (wait, name)
                self.report(worker, agent_pb2.WORKER_STATE_PREPARING, waits=said)

        credentials = worker.payload.get("credentials") or []
        while credentials:
            answer = await self._ask_secrets(worker)
            if answer is not None and not answer.missing:
                worker.secrets = dict(answer.values)
                break
            missing = answer.missing[0] if answer is not None else credentials[0]["secret"]
            preparing(agent_pb2.WAIT_SECRET, missing)
            await asyncio.sleep(self.config.prepare_poll_seconds)
        for drive, source, folder in prepare.drives_to_fill(worker.payload, self.drive_root):
            preparing(agent_pb2.WAIT_DRIVE, drive)
            problem = await asyncio.to_thread(
                prepare.fill_drive,
                source,
                folder,
                allowed_roots=self.config.fill_roots,
                gid=worker.workspace_gid if isinstance(worker, ProcessWorker) else None,
            )
            if problem is not None:
                self._ended_before_start(worker, Exit(None, EndCause.NOT_STARTED, detail=problem))
                return
        if isinstance(worker, docker.ContainerWorker):
            image = (agent_pb2.WAIT_IMAGE, worker.image or "")

            async def pulling(done: str) -> None:
                self.report(worker, agent_pb2.WORKER_STATE_PULLING, waits=image, detail=done)

            failed = await worker.prepare(pulling)
            if failed is not None:
                self._ended_before_start(worker, failed)
                return
        self.report(worker, agent_pb2.WORKER_STATE_READY)

    def _ended_before_start(self, worker: Worker, exit: Exit) -> None:
        worker.exited.set()
        self.report(worker, agent_pb2.WORKER_STATE_EXITED, exit)
        self._forget(worker)

    async def _ask_secrets(self, worker: Worker) -> agent_pb2.SecretValues | None:
        """The worker's secret values from the server; None when it does not answer in time."""
        answer: asyncio.Future[agent_pb2.SecretValues] = asyncio.get_running_loop().create_future()
        key = worker.worker_id
        self.secret_answers[key] = answer
        asked = agent_pb2.SecretRequest(worker_id=key, attempt=worker.attempt)
        self._send(durable=False, secret_request=asked)
        try:
            return await asyncio.wait_for(answer, self.config.prepare_poll_seconds * 2)
        except TimeoutError:
            return None
        finally:
            if self.secret_answers.get(key) is answer:
                del self.secret_answers[key]

    def _watch(self, worker: Worker) -> None:
        self._keep(asyncio.create_task(self._until_exit(worker)))

    async def _until_exit(self, worker: Worker) -> None:
        exit = await worker.wait()
        if self.workers.get(worker.worker_id) is not worker:
            return  # deleted meanwhile
        worker.exited.set()
        # Followers read to the end before the log is archived.
        await asyncio.sleep(0)
        mine = f"follow:{worker.worker_id}"
        for follow in [t for t in self.follows.values() if t.get_name() == mine]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(follow), 2)
        # Its last samples as it ended (a kill of its main process is seen by no look).
        last = self.sampler.ended(worker, oom_killed=exit.cause == OOM_KILLED, at_ms=exit.at_ms)
        if last:
            self._send(metrics=agent_pb2.MetricBatch(samples=last))
        self.report(worker, agent_pb2.WORKER_STATE_EXITED, exit)
        await asyncio.to_thread(worker.log.archive)
        self._forget(worker)

    def _forget(self, worker: Worker) -> None:
        """The end is in the outbox: the runtime folder may go; Hello names it until acked."""
        self._release_master_port(worker.worker_id)
        self.ended[worker.worker_id] = worker.attempt
        worker.release()
        if self.workers.get(worker.worker_id) is worker:
            del self.workers[worker.worker_id]

    # --- samples --------------------------------------------------------------------------

    async def _sample_start(self, worker: Worker) -> None:
        """The worker's first samples as soon as its process is in its group (a container's
        from its engine): one killed within seconds has its start besides its end (seed L-52)."""
        group = worker.cgroup
        waited = 0.0
        while group is not None and not group.pids() and waited < START_SAMPLE_WAIT_S:
            if worker.exited.is_set():
                return
            await asyncio.sleep(START_SAMPLE_POLL_S)
            waited += START_SAMPLE_POLL_S
        reading: dict[str, float] = {}
        if isinstance(worker, docker.ContainerWorker):
            with contextlib.suppress(Exception):  # an engine that does not answer: the looks
                reading = await worker.sample()
        if self.workers.get(worker.worker_id) is not worker:
            return  # deleted meanwhile
        try:
            look = self.sampler.started(worker, reading)
        except Exception:  # a bad reading must not end the worker's watch
            log.exception("sampling a worker's start failed")
            return
        for progress in look.progress:
            self._send(progress=progress)
        if look.samples:
            self._send(metrics=agent_pb2.MetricBatch(samples=look.samples))

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.sample_seconds)
            try:
                await self.sample_once()
            except Exception:  # a bad reading must not end the sampling
                log.exception("sampling failed")

    async def sample_once(self) -> None:
        workers = list(self.workers.values())
        readings = {}
        for w in workers:
            if isinstance(w, docker.ContainerWorker) and w.started and not w.exited.is_set():
                with contextlib.suppress(Exception):  # an engine that does not answer: next time
                    readings[w.worker_id] = await w.sample()
        look = self.sampler.look(workers, readings)
        for progress in look.progress:
            self._send(progress=progress)
        if look.samples:
            self._send(metrics=agent_pb2.MetricBatch(samples=look.samples))
        if self.config.nvml is not None:
            for index, fault in self.config.nvml.faults().items():
                self._send(gpu_health=agent_pb2.GpuHealth(index=index, healthy=False, reason=fault))


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


def private_folders(data_dir: Path, workloads: Path) -> None:
    """The agent's folders are its own: workloads may pass through to their own folder (0711:
    no listing), and read nothing else (logs, the outbox: 0700). The two roots may be links
    the machine's owner made; nothing inside them may be."""
    data_dir, workloads = data_dir.resolve(), workloads.resolve()
    for folder, mode in (
        (data_dir, 0o711),
        (data_dir / "logs", 0o700),
        (data_dir / "outbox", 0o700),
        (workloads, 0o711),
        (workloads / "workers", 0o711),
        (workloads / "drives", 0o711),
    ):
        folder.mkdir(mode=mode, parents=True, exist_ok=True)
        if folder.is_symlink() or folder.stat().st_uid != os.geteuid():
            raise SystemExit(f"astraeus agent: {folder} is not this agent's own folder")
        folder.chmod(mode)


def start_payload(start: agent_pb2.StartWorker) -> dict[str, Any]:
    """The typed start message as the payload kept in the worker's folder (payload.json)."""
    payload: dict[str, Any] = {
        "worker": start.worker,
        "run": start.run,
        "rank": start.rank,
        "attempt": start.attempt,
        "workspace_id": start.workspace_id,
        "image": start.image or None,
        "command": list(start.command),
        "user": start.user or None,
        "working_dir": start.working_dir or None,
        "environment": dict(start.environment),
        "astraeus_environment": dict(start.astraeus_environment),
        "mounts": [
            {
                "drive": m.drive,
                "path": m.path,
                "fill_from": m.fill_from or None,
                "read_only": m.read_only,
            }
            for m in start.mounts
        ],
        "credentials": [
            {"secret": c.secret, "env": c.env or None, "file": c.file or None}
            for c in start.credentials
        ],
        "cpu": start.cpu if start.HasField("cpu") else None,
        "memory_limit_bytes": (
            start.memory_limit_bytes if start.HasField("memory_limit_bytes") else None
        ),
        "gpu_ids": list(start.gpu_ids),
    }
    return payload


def _ends(message: agent_pb2.AgentMessage, worker_id: int) -> bool:
    return (
        message.WhichOneof("body") == "worker_event"
        and message.worker_event.worker_id == worker_id
        and message.worker_event.state == agent_pb2.WORKER_STATE_EXITED
    )
