"""The server's commands to this agent's workers: START (prepare, then wait at the gang
barrier), RELEASE (the barrier is passed: run), STOP and DELETE."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from astraeus.agent.v1 import agent_pb2

from agent.executor import EndCause, Exit
from agent.logs import WorkerLog
from agent.slurm_watch import SlurmWatching
from agent.state import Worker
from agent.workers import WorkerKeeping

log = logging.getLogger("astraeus.agent")
SLURM = "slurm"  # the executor of a Slurm node's agent (agent/slurm_watch.py)


class CommandHandling(WorkerKeeping, SlurmWatching):
    """The server's commands carried out (a part of ``Agent``)."""

    async def _command(self, command: agent_pb2.Command) -> None:
        key = command.worker_id
        worker: Worker | None
        if not key:
            return  # names no worker (a command of a server before ids): nothing to do
        if command.kind == agent_pb2.COMMAND_KIND_WATCH:
            self._watch_slurm(key, command.watch)
        elif self.config.executor == SLURM and command.kind == agent_pb2.COMMAND_KIND_STOP:
            self._end_watch(key)  # Slurm ended it here (Slurm's to stop, never the agent's)
        elif self.config.executor == SLURM and command.kind == agent_pb2.COMMAND_KIND_DELETE:
            self._forget_watch(key)  # its run was deleted: its copy of the log goes too
            WorkerLog(self.log_root, str(key)).delete()
        elif self.config.executor == SLURM:
            log.warning("a Slurm node's agent runs no workers: command %s ignored", command.kind)
        elif command.kind == agent_pb2.COMMAND_KIND_START:
            payload = start_payload(command.start)
            current = self.workers.get(key)
            if current is not None and current.attempt == int(payload.get("attempt", 0)):
                return  # delivered again after a reconnect
            if current is not None:
                await current.stop()
            self._release_master_port(key)
            worker = self._new_worker(key, await self._with_uid(key, payload))
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
        "cpu_request": start.cpu_request if start.HasField("cpu_request") else None,
        "memory_limit_bytes": (
            start.memory_limit_bytes if start.HasField("memory_limit_bytes") else None
        ),
        "gpu_ids": list(start.gpu_ids),
        # the gang's machines: only they reach rank 0's MASTER_PORT (agent/network.py)
        "gang_addresses": list(start.gang_addresses),
    }
    if start.worker_key:  # names it on this machine (agent/identity.py local_name)
        payload["worker_key"] = start.worker_key
    return payload
