"""The workers this agent keeps: made for its executor (processes or containers), taken back
after a restart, prepared up to the gang barrier (agent/preparation.py), their rank 0's
MASTER_PORT claimed (agent/master_ports.py), watched to their end and forgotten once the end is
reported; and the server's commands to them: START (prepare, then wait at the gang barrier),
RELEASE (the barrier is passed: run), STOP and DELETE.

Workers are kept by shims that outlive the agent; a restarted agent takes them back
(``adopt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from pathlib import Path

from astraeus.agent.v1 import agent_pb2

from agent import docker, network, prepare, sandbox, uid_handover
from agent import engine as engines
from agent.commands import Handler
from agent.config import AgentConfig
from agent.executor import OOM_KILLED, EndCause, Exit, ProcessWorker
from agent.identity import local_name, uid_seed
from agent.log_replies import LogReplies
from agent.logs import WorkerLog
from agent.master_ports import MasterPorts
from agent.network import Network, gang_rendezvous
from agent.preparation import Preparation
from agent.sampling import Sampling
from agent.start import StartSpec
from agent.state import Background, Outgoing, Worker

log = logging.getLogger("astraeus.agent")
FOLLOW_DRAIN_S = 2.0  # an ended worker's follows read to its log's end, this long at most


class Workers:
    """The agent's workers, from their making to their end, by the server's id for each
    (never its name: two workspaces may both run `train` here)."""

    def __init__(
        self,
        config: AgentConfig,
        outgoing: Outgoing,
        background: Background,
        sampling: Sampling,
        logs: LogReplies,
        isolation: sandbox.Isolation,
    ) -> None:
        self.config = config
        self.outgoing = outgoing
        self.background = background
        self.sampling = sampling
        self.logs = logs
        # What this machine gives its workers (agent/sandbox.py).
        self.isolation = isolation
        self.by_id: dict[int, Worker] = {}
        self.ended: dict[int, int] = {}  # reported ends not yet acknowledged
        self.preparation = Preparation(config, outgoing, self._ended_before_start)
        self.ports = MasterPorts()
        # Which workspace last ran under each user id, and the places a user id may have left
        # files in (agent/uid_handover.py).
        self.uid_ledger = uid_handover.Ledger(config.data_dir / uid_handover.LEDGER)
        self.shared_places = uid_handover.shared_places() if config.users.switch else []
        self._resolved: dict[str, str] = {}  # MASTER_ADDR names (and gangs' machines') as addresses

    def commands(self) -> dict[agent_pb2.CommandKind.ValueType, Handler]:
        """The server's commands this part carries out (agent/commands.py)."""
        return {
            agent_pb2.COMMAND_KIND_START: self.start,
            agent_pb2.COMMAND_KIND_RELEASE: self.release,
            agent_pb2.COMMAND_KIND_STOP: self.stop,
            agent_pb2.COMMAND_KIND_DELETE: self.delete,
        }

    # --- the server's commands ------------------------------------------------------------

    async def start(self, command: agent_pb2.Command) -> None:
        key = command.worker_id
        spec = StartSpec.of(command.start)
        current = self.by_id.get(key)
        if current is not None and current.attempt == spec.attempt:
            return  # delivered again after a reconnect
        if current is not None:
            await current.stop()
        self.ports.release(key)
        worker = self._new_worker(key, await self._with_uid(key, spec))
        worker.keep()
        self.by_id[key] = worker
        self._network_rules()
        taken = self.ports.reserve(worker)
        if taken is not None:
            self._ended_before_start(worker, taken)
            return
        self.preparation.begin(worker)

    async def release(self, command: agent_pb2.Command) -> None:
        worker = self.by_id.get(command.worker_id)
        if worker is None or worker.started or worker.exited.is_set():
            return
        self._network_rules()
        self.ports.started(command.worker_id)  # the worker's process binds it now
        await worker.start()
        self.outgoing.report(worker, agent_pb2.WORKER_STATE_RUNNING)
        self._watch(worker)
        self.background.keep(asyncio.create_task(self.sampling.start(worker)))

    async def stop(self, command: agent_pb2.Command) -> None:
        worker = self.by_id.get(command.worker_id)
        if worker is None:
            return
        if worker.started:
            await worker.stop()
            return
        self.preparation.cancel(command.worker_id)
        self._ended_before_start(worker, Exit(None, EndCause.STOPPED_BEFORE_START))

    async def delete(self, command: agent_pb2.Command) -> None:
        key = command.worker_id
        self.preparation.cancel(key)
        worker = self.by_id.pop(key, None)
        self.ports.release(key)
        if worker is not None:
            await worker.stop()
            worker.release()
        WorkerLog(self.config.log_root, str(key)).delete()

    # --- what the stream says of them -----------------------------------------------------

    def known(self) -> list[agent_pb2.KnownWorker]:
        """The workers kept, and those whose end the server has not acknowledged (Hello)."""
        known = [
            agent_pb2.KnownWorker(worker_id=w.worker_id, attempt=w.attempt, ended=w.exited.is_set())
            for w in self.by_id.values()
        ]
        known += [
            agent_pb2.KnownWorker(worker_id=worker_id, attempt=attempt, ended=True)
            for worker_id, attempt in self.ended.items()
            if worker_id not in self.by_id
        ]
        return sorted(known, key=lambda k: k.worker_id)

    def acknowledged(self, pending: list[agent_pb2.AgentMessage]) -> None:
        """The ends no message still ``pending`` in the outbox reports are known to the server."""
        self.ended = {
            worker_id: attempt
            for worker_id, attempt in self.ended.items()
            if any(_ends(m, worker_id) for m in pending)
        }

    # --- executors ------------------------------------------------------------------------
    async def _with_uid(self, worker_id: int, spec: StartSpec) -> StartSpec:
        """The start with the worker's own user id of the range (identity.py's
        free_uid: the same at every attempt), free among the kept workers and handed over from
        the workspace that last ran under it only once nothing of that one is left
        (agent/uid_handover.py); an id with something left is passed over for the next."""
        if not self.config.users.switch:
            return spec
        taken = {w.spec.uid for w in self.by_id.values() if w.spec.uid is not None}
        workspace = spec.workspace_id
        while True:
            try:
                uid = self.config.users.free_uid(taken, uid_seed(worker_id, spec))
            except LookupError:
                return spec  # none free: start() says so
            if not self.uid_ledger.same_workspace(uid, workspace):
                left = await asyncio.to_thread(uid_handover.hand_over, uid, self.shared_places)
                if left:
                    log.warning("user id %d not handed over, passed over: %s", uid, left[0])
                    taken.add(uid)
                    continue
                self.uid_ledger.record(uid, workspace)
            return spec.with_uid(uid)

    def _new_worker(self, worker_id: int, spec: StartSpec) -> Worker:
        log_ = WorkerLog(self.config.log_root, str(worker_id))
        folder = self.config.worker_root / local_name(worker_id, spec)
        if self.config.executor == "docker":
            drives = prepare.drive_folder(self.config.drive_root, spec, "x").parent
            container = docker.ContainerWorker(
                worker_id, spec, log_, folder, engine=self._engine(), drives=drives
            )
            container.users, container.install = self.config.users, self.config.install
            container.pids_limit = self.isolation.pids_max
            return container
        return self._process_worker(
            ProcessWorker(worker_id, spec, log_, folder, drive_root=self.config.drive_root)
        )

    def _process_worker(self, worker: ProcessWorker) -> ProcessWorker:
        c = self.config
        worker.users, worker.install = c.users, c.install
        worker.fill_roots, worker.mount_roots = c.fill_roots, c.mount_roots
        worker.isolation, worker.machine_memory = self.isolation, c.memory_bytes
        return worker

    def _adopt_worker(self, folder: Path) -> Worker | None:
        if docker.is_container_folder(folder):
            adopted = docker.ContainerWorker.adopt(folder, self.config.log_root, self._engine())
            if adopted is not None:
                adopted.drives = prepare.drive_folder(
                    self.config.drive_root, adopted.spec, "x"
                ).parent
                adopted.users, adopted.install = self.config.users, self.config.install
                adopted.pids_limit = self.isolation.pids_max
            return adopted
        process = ProcessWorker.adopt(folder, self.config.log_root)
        if process is not None:
            process.drive_root = self.config.drive_root
            self._process_worker(process)
        return process

    def _engine(self) -> engines.Engine:
        return engines.engine_at(self.config.docker_socket)

    # --- starting up: the workers a previous agent left -----------------------------------

    def adopt(self) -> None:
        """Take back the workers a previous agent left: running, at the barrier, or ended."""
        if not self.config.worker_root.exists():
            return
        for folder in sorted(p for p in self.config.worker_root.iterdir() if p.is_dir()):
            worker = self._adopt_worker(folder)
            if worker is None:
                continue
            self.by_id[worker.worker_id] = worker
            if worker.started:
                self._watch(worker)
            else:
                self.preparation.begin(worker)  # at the barrier: credentials and drives again
            log.info("took back worker %s (attempt %s)", worker.name, worker.attempt)

    async def remove_orphans(self) -> None:
        """Containers of workers this agent no longer has (deleted while it was away)."""
        if self.config.executor != "docker":
            return
        with contextlib.suppress(Exception):
            install = self.config.install
            kept = {f"{install}-{k}" for k in self.by_id}
            await engines.remove_orphans(self._engine(), kept, install)

    # --- the network: what its workloads reach (agent/network.py) -------------------------

    @functools.cached_property
    def network(self) -> Network:
        """This agent's nftables table (started by ``start_network``)."""
        c = self.config
        return Network(c.install, c.users.uids, c.server)

    def start_network(self) -> None:
        """The workloads' network rules, made as the agent starts, before its Hello:
        ``self.network.enforced`` says whether this machine has them."""
        if self.config.executor != "process" or not self.config.users.switch:
            self.network.why_not = (
                f"the {self.config.executor} executor's workloads are not its processes"
                if self.config.executor != "process"
                else "workloads run as the agent's own user"
            )
            log.warning("network: NOT enforced (%s)", self.network.why_not)
            return
        self.network.start()

    async def network_forever(self) -> None:
        """The rules brought up to date with the workers taken back and the machine's
        listeners, every network.REFRESH_SECONDS."""
        looks = 0
        while self.network.enforced:
            self._network_rules()
            looks += 1
            if looks % network.SWEEP_EVERY == 0:
                await asyncio.to_thread(network.sweep)  # agents killed since
            await asyncio.sleep(network.REFRESH_SECONDS)

    def _network_rules(self) -> None:
        """The rules as the workers kept now need them, the machine's listeners looked at
        again (also every network.REFRESH_SECONDS: ``network_forever``)."""
        self.ports.expire_offers()
        if not self.network.enforced:
            return
        kept = [(w.spec, self._uid_of(w)) for w in self.by_id.values()]
        self.network.update(gang_rendezvous(kept, self._resolved))

    def _uid_of(self, worker: Worker) -> int | None:
        with contextlib.suppress(LookupError, ValueError, AssertionError):
            identity = self.config.users.of_worker(worker.spec)
            return identity.uid if identity is not None else None
        return None

    def _ended_before_start(self, worker: Worker, exit: Exit) -> None:
        worker.exited.set()
        self.outgoing.report(worker, agent_pb2.WORKER_STATE_EXITED, exit)
        self._forget(worker)

    # --- to the end -----------------------------------------------------------------------

    def _watch(self, worker: Worker) -> None:
        self.background.keep(asyncio.create_task(self._until_exit(worker)))

    async def _until_exit(self, worker: Worker) -> None:
        exit = self.ports.refused(worker, await worker.wait(), self._uid_of(worker))
        # Its follows end with it, a deleted or replaced one's too (they hold the object).
        worker.exited.set()
        if self.by_id.get(worker.worker_id) is not worker:
            return  # deleted meanwhile
        # Followers read to the end before the log is archived.
        await asyncio.sleep(0)
        await self.logs.drained(worker.worker_id, FOLLOW_DRAIN_S)
        self.sampling.last(
            worker,
            oom_killed=exit.cause == OOM_KILLED,
            at_ms=exit.at_ms,
            oom_kill_seen=exit.oom_kill_seen,
        )
        self.outgoing.report(worker, agent_pb2.WORKER_STATE_EXITED, exit)
        await asyncio.to_thread(worker.log.archive)
        self._forget(worker)

    def _forget(self, worker: Worker) -> None:
        """The end is in the outbox: the runtime folder may go; Hello names it until acked."""
        self.ports.release(worker.worker_id)
        self.ended[worker.worker_id] = worker.attempt
        worker.release()
        if self.by_id.get(worker.worker_id) is worker:
            del self.by_id[worker.worker_id]
        self._network_rules()


def _ends(message: agent_pb2.AgentMessage, worker_id: int) -> bool:
    return (
        message.WhichOneof("body") == "worker_event"
        and message.worker_event.worker_id == worker_id
        and message.worker_event.state == agent_pb2.WORKER_STATE_EXITED
    )
