"""What one agent holds (its workers, its tasks, what waits for the server), and how it says
something to the server.

Every message the agent sends waits in its outbox (on disk for what must not be lost) until
the server acknowledges it, and is sent again after a reconnect or a restart, so neither a
server restart nor an agent restart loses a state change or a failure snapshot.

The agent's parts are classes over this one, each in a file of its own: sampling
(agent/sampling.py), log replies (agent/log_replies.py), its workers (agent/workers.py), the
server's commands (agent/commands.py), and the stream (agent/connection.py: ``Agent``).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astraeus.agent.v1 import agent_pb2

from agent import docker, rendezvous, sandbox, uid_handover
from agent.config import AgentConfig
from agent.executor import Exit, ProcessWorker
from agent.log_watch import LogWatch
from agent.metrics import Sampler
from agent.outbox import Outbox
from agent.slurm_node import SlurmNode
from agent.watched import WatchedWorker

Worker = ProcessWorker | docker.ContainerWorker


@dataclass
class AgentState:
    """What every part of the agent reads and changes (``Agent``, agent/connection.py)."""

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
    # Rank 0's MASTER_PORT: bound from its START until its process starts, claimed machine-wide
    # until the worker is gone (agent/rendezvous.py).
    reserved: dict[int, rendezvous.Claim] = field(default_factory=dict)
    # A Slurm node's agent: the workers Slurm runs here that it watches (agent/slurm_watch.py),
    # by the server's id, and the one task that looks at them.
    watched: dict[int, WatchedWorker] = field(default_factory=dict)
    watching: asyncio.Task[None] | None = None
    outbox: Outbox = field(init=False)
    sampler: Sampler = field(init=False)
    log_watch: LogWatch = field(init=False)  # wakes follows as their logs are written
    slurm: SlurmNode = field(init=False)  # this node's Slurm, for a Slurm node's agent
    # What this machine gives its workers (agent/sandbox.py), which workspace last ran under
    # each user id, and the places a user id may have left files in (agent/uid_handover.py).
    isolation: sandbox.Isolation = field(init=False)
    uid_ledger: uid_handover.Ledger = field(init=False)
    shared_places: list[Path] = field(init=False)

    def __post_init__(self) -> None:
        private_folders(self.config.data_dir, self.config.workload_dir)
        self.isolation = isolation(self.config)
        self.uid_ledger = uid_handover.Ledger(self.config.data_dir / uid_handover.LEDGER)
        self.shared_places = uid_handover.shared_places() if self.config.users.switch else []
        self.outbox = Outbox(self.config.data_dir / "outbox")
        self.sampler = Sampler(
            self.config.nvml, gpu_memory={g.index: g.memory_bytes for g in self.config.gpus}
        )
        self.log_watch = LogWatch(self.log_root)
        self.slurm = SlurmNode(self.config.machine, self.config.slurm_conf, self.config.slurm_bin)

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
            if exit.uid is not None:
                event.uid, event.blocked_at = exit.uid, exit.blocked_at
            if exit.offered_port is not None:
                event.offered_port = exit.offered_port
            if exit.code is not None:
                event.exit_code = exit.code
            if exit.pids_limit is not None:
                event.pids_limit = exit.pids_limit
            # A failure's snapshot; and a stop's: the server keeps it when it stopped the
            # worker for its time limit, a preemption or a stall, or had lost its machine.
            # None of an attempt that never started: its log holds an earlier one's lines.
            if (exit.code != 0 or worker.stopping) and worker.started:
                event.log_tail = worker.log.snapshot()
        self._send(worker_event=event)

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self.running.add(task)
        task.add_done_callback(self.running.discard)


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


def isolation(config: AgentConfig) -> sandbox.Isolation:
    """What this machine gives its workers: the process executor's as probed here; a Docker
    engine's containers have every part (agent/docker.py); a Slurm node runs none of its own."""
    if config.executor == "slurm":
        return sandbox.Isolation()
    if config.executor == "docker":
        enforced = (
            set(sandbox.PARTS)
            if config.users.switch
            else set(sandbox.PARTS)
            - {
                sandbox.UNPRIVILEGED_USER,
                sandbox.UID_HANDOVER,
            }
        )
        if not config.workload_pids_max:
            enforced.discard(sandbox.PROCESS_LIMIT)
        return sandbox.Isolation(frozenset(enforced), config.workload_pids_max)
    return sandbox.probe(config.users.switch, config.workload_pids_max)
