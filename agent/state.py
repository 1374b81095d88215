"""What the agent's parts share, each given it when made (agent/connection.py makes them): how
the agent says something to the server (``Outgoing``), the tasks it keeps running
(``Background``), and the machine's folders and isolation.

Every message the agent sends waits in its outbox (on disk for what must not be lost) until
the server acknowledges it, and is sent again after a reconnect or a restart, so neither a
server restart nor an agent restart loses a state change or a failure snapshot.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from astraeus.agent.v1 import agent_pb2

from agent import docker, sandbox
from agent.config import AgentConfig
from agent.executor import Exit, ProcessWorker
from agent.outbox import Outbox

Worker = ProcessWorker | docker.ContainerWorker


class Outgoing:
    """The agent's messages to the server: kept in the outbox until acknowledged (unless
    passing), and queued for the stream (agent/connection.py) to send."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.queue: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
        # When a message was last queued (time.monotonic()): the server takes any message as
        # a sign of life, so a heartbeat is due only after an interval with none.
        self.sent_at = 0.0
        # The server takes a Report (its Welcome said protocol 4 or more): a sample period's
        # progress and samples go as one message, not one a worker and one for the samples.
        self.takes_reports = False

    def send(self, durable: bool = True, **body: Any) -> None:
        """Queue a message; kept in the outbox until acknowledged unless it is a passing one."""
        message = agent_pb2.AgentMessage(id=self.outbox.next_id(), **body)
        if durable:
            self.outbox.put(message)
        self.queue.put_nowait(message)
        self.sent_at = time.monotonic()

    def reports(self, progress: list[agent_pb2.Progress], samples: list[agent_pb2.Sample]) -> None:
        """A sample period's progress reports and samples (``period_bodies``)."""
        for body in period_bodies(progress, samples, reports=self.takes_reports):
            self.send(**body)

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
        self.send(worker_event=worker_event(worker, state, exit, waits=waits, detail=detail))


# A Report's progress entries, at most (the server refuses a report of more: backend/gateway/
# writer.py MAX_REPORT_PROGRESS): a machine of more workers sends its period in several.
REPORT_PROGRESS = 1024


def period_bodies(
    progress: list[agent_pb2.Progress], samples: list[agent_pb2.Sample], *, reports: bool
) -> list[dict[str, Any]]:
    """The messages' bodies of a sample period: one Report to a server that takes it
    (``reports``: its Welcome said protocol 4; more than one for more than REPORT_PROGRESS
    workers' progress), else each progress report and the samples' batch apart; none when
    there is nothing to say."""
    if not progress and not samples:
        return []
    if reports:
        batch = agent_pb2.MetricBatch(samples=samples)
        first = agent_pb2.Report(progress=progress[:REPORT_PROGRESS], metrics=batch)
        rest = range(REPORT_PROGRESS, len(progress), REPORT_PROGRESS)
        return [{"report": first}] + [
            {"report": agent_pb2.Report(progress=progress[i : i + REPORT_PROGRESS])} for i in rest
        ]
    bodies: list[dict[str, Any]] = [{"progress": one} for one in progress]
    if samples:
        bodies.append({"metrics": agent_pb2.MetricBatch(samples=samples)})
    return bodies


def worker_event(
    worker: Worker,
    state: int,
    exit: Exit | None = None,
    *,
    waits: tuple[agent_pb2.Wait.ValueType, str] | None = None,
    detail: str = "",
) -> agent_pb2.WorkerEvent:
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
    return event


class Background:
    """The tasks the agent's parts start and nobody awaits, held until they are done (the loop
    keeps only weak references)."""

    def __init__(self) -> None:
        self.running: set[asyncio.Task[Any]] = set()

    def keep(self, task: asyncio.Task[Any]) -> None:
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
