"""A Slurm node's agent watching the workers Slurm runs here (``--executor slurm``, issue 25).

The server sends a WATCH for each worker its import placed on this node (a task of a job it
submitted, or an imported job's part here), and sends them all again at each Hello. The agent
looks at the node's jobs every LOOK_S (one ``scontrol listpids`` for them all), finds each
worker's processes and the group Slurm put them in, and from then on samples it as its own
workers (agent/sampling.py: CPU, memory, its GPUs, its progress file), and copies its log every
COPY_S. It never reports a watched worker's state: Slurm starts and ends it, the import records
that. When its processes are gone (or the server says Slurm ended it here), its last output is
copied, its last samples sent, and its log archived, as for a worker of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from astraeus.agent.v1 import agent_pb2

from agent import slurm_node
from agent.cgroups import Measured
from agent.commands import Handler
from agent.config import AgentConfig
from agent.log_replies import LogReplies
from agent.logs import WorkerLog
from agent.sampling import Sampling
from agent.slurm_node import ProcessSet, SlurmNode, TaskPid
from agent.state import Background, Outgoing
from agent.watched import Watch, WatchedWorker

log = logging.getLogger("astraeus.agent")

LOOK_S = 2.0
COPY_S = 0.25
# A watched worker whose processes are never seen (its job ended before the watch came) is
# given up after this: the import, a little behind Slurm, can place a job that has ended.
UNSEEN_S = 120.0
FOLLOW_DRAIN_S = 2.0


class SlurmWatch:
    """A Slurm node agent's watched workers, by the server's id for each, and the one task that
    looks at them; the Slurm commands are its own (``commands``)."""

    def __init__(
        self,
        config: AgentConfig,
        outgoing: Outgoing,
        background: Background,
        sampling: Sampling,
        logs: LogReplies,
    ) -> None:
        self.config = config
        self.outgoing = outgoing
        self.background = background
        self.sampling = sampling
        self.logs = logs
        self.slurm = SlurmNode(config.machine, config.slurm_conf, config.slurm_bin)
        self.watched: dict[int, WatchedWorker] = {}
        self.watching: asyncio.Task[None] | None = None

    def commands(self) -> dict[agent_pb2.CommandKind.ValueType, Handler]:
        """The server's commands to a Slurm node's agent (agent/commands.py): Slurm starts and
        stops its workers, never the agent."""
        return {
            agent_pb2.COMMAND_KIND_WATCH: self.watch,
            agent_pb2.COMMAND_KIND_STOP: self.ended,
            agent_pb2.COMMAND_KIND_DELETE: self.delete,
        }

    async def watch(self, command: agent_pb2.Command) -> None:
        self._watch(command.worker_id, command.watch)

    async def ended(self, command: agent_pb2.Command) -> None:
        """A STOP: Slurm ended it here (Slurm's to stop, never the agent's)."""
        self._end_watch(command.worker_id)

    async def delete(self, command: agent_pb2.Command) -> None:
        """Its run was deleted: its copy of the log goes too."""
        self._forget_watch(command.worker_id)
        WorkerLog(self.config.log_root, str(command.worker_id)).delete()

    async def ignore(self, command: agent_pb2.Command) -> None:
        log.warning("a Slurm node's agent runs no workers: command %s ignored", command.kind)

    def _watch(self, worker_id: int, message: agent_pb2.WatchWorker) -> None:
        watch = Watch.of(message)
        current = self.watched.get(worker_id)
        if current is not None and current.attempt == watch.attempt:
            return  # sent again (a Hello, a reconnect)
        if current is not None:  # an earlier instance of a job Slurm queued again: gone
            current.exited.set()  # (its follows end; its log is begun again below)
            current.close()
        worker = WatchedWorker(worker_id, watch, self._watched_log(worker_id))
        self.watched[worker_id] = worker
        log.info("watching worker %s (Slurm job %s)", worker.name, watch.job_id)
        if self.watching is None or self.watching.done():
            self.watching = asyncio.create_task(self._watching())
            self.background.keep(self.watching)

    def _watched_log(self, worker_id: int) -> WorkerLog:
        copy = WorkerLog(self.config.log_root, str(worker_id))
        copy.begin()  # made again whole from the node's log
        return copy

    def _end_watch(self, worker_id: int) -> None:
        """Slurm ended the worker here (the server says so, once it recorded the end): its
        watch ends at the next copy, and its last lines go to the server, where they fill the
        failure snapshot of a job that failed (Slurm's records hold no output)."""
        found = self.watched.get(worker_id)
        if found is not None:
            found.snapshot_asked = True
            found.ended_here.set()
        else:  # it ended here before: its lines are in its archived log
            self._send_snapshot(worker_id, 0)

    def _send_snapshot(self, worker_id: int, attempt: int) -> None:
        lines = WorkerLog(self.config.log_root, str(worker_id)).snapshot()
        if lines:
            event = agent_pb2.WorkerEvent(
                worker_id=worker_id,
                attempt=attempt,
                state=agent_pb2.WORKER_STATE_EXITED,
                at_ms=int(time.time() * 1000),
                log_tail=lines,
            )
            self.outgoing.send(worker_event=event)

    def _forget_watch(self, worker_id: int) -> None:
        """A deleted run's worker: no more watching, no copy of its log kept."""
        found = self.watched.pop(worker_id, None)
        if found is not None:
            found.exited.set()
            found.close()

    async def _watching(self) -> None:
        """Look at the node's jobs every LOOK_S and copy the watched logs every COPY_S, while
        anything is watched."""
        look_at = 0.0
        while self.watched:
            if time.monotonic() >= look_at:
                look_at = time.monotonic() + LOOK_S
                found = await self.slurm.processes()
                if found is not None:
                    for worker in list(self.watched.values()):
                        self._look(worker, found)
            watched = list(self.watched.values())
            await asyncio.to_thread(_copy_all, watched)
            for worker in watched:
                if worker.ended_here.is_set() and self.watched.get(worker.worker_id) is worker:
                    await self._finish(worker)
            await asyncio.sleep(COPY_S)

    def _look(self, worker: WatchedWorker, found: list[TaskPid]) -> None:
        watch = worker.watch
        mine = slurm_node.of_worker(found, watch.job_id, watch.task)
        worker.open_run_folder()
        if watch.batch_output:
            batch = slurm_node.batch_process(found, watch.job_id)
            if batch is not None:
                worker.copy_batch_output(batch)
        if mine:
            if isinstance(worker.cgroup, ProcessSet) or worker.cgroup is None:
                worker.cgroup = self._measure(worker, mine)
            if not worker.started:
                worker.started = True
                self.background.keep(asyncio.create_task(self.sampling.start(worker)))
        elif worker.started or time.monotonic() - worker.since > UNSEEN_S:
            worker.ended_here.set()

    def _measure(self, worker: WatchedWorker, mine: list[TaskPid]) -> Measured:
        """The group Slurm put the worker's processes in, else the processes themselves."""
        whole_job = worker.watch.task is None
        for process in mine:  # (a step's own helpers may be in none of the job's groups)
            group = slurm_node.job_group(process.pid, worker.watch.job_id, whole_job=whole_job)
            if group is not None:
                break
        else:
            return ProcessSet([p.pid for p in mine])
        worker.memory_limit_bytes = slurm_node.memory_limit(group, self.config.memory_bytes)
        return group

    async def _finish(self, worker: WatchedWorker) -> None:
        """Its processes are gone: the rest of its output copied, its last report and samples
        sent, its follows ended, its log archived (served until the run is deleted)."""
        if worker.copy is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(worker.copy.copy)
        worker.exited.set()
        await self.logs.drained(worker.worker_id, FOLLOW_DRAIN_S)
        if worker.started:
            self.sampling.last(worker)
        worker.close()
        await asyncio.to_thread(worker.log.archive)
        if self.watched.get(worker.worker_id) is worker:
            del self.watched[worker.worker_id]
        if worker.snapshot_asked:  # (a STOP from here on finds it archived, and sends it)
            self._send_snapshot(worker.worker_id, worker.attempt)
        log.info("worker %s (Slurm job %s) ended here", worker.name, worker.watch.job_id)


def _copy_all(watched: list[WatchedWorker]) -> None:
    for worker in watched:
        if worker.copy is not None and not worker.exited.is_set():
            try:
                worker.copy.copy()
            except OSError as error:  # its file went away: what was copied stays
                log.warning("copying %s's log: %s", worker.name, error)
