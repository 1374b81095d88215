"""The workers this agent keeps: made for its executor (processes or containers), taken back
after a restart, prepared (credentials, drives, image) up to the gang barrier, their rank 0's
MASTER_PORT claimed, watched to their end and forgotten once the end is reported.

Workers are kept by shims that outlive the agent; a restarted agent takes them back
(``adopt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from pathlib import Path
from typing import Any

from astraeus.agent.v1 import agent_pb2

from agent import docker, prepare, rendezvous, uid_handover
from agent import engine as engines
from agent.executor import OOM_KILLED, EndCause, Exit, ProcessWorker
from agent.identity import local_name, uid_seed
from agent.logs import WorkerLog
from agent.network import Network, gang_rendezvous
from agent.state import AgentState, Worker

log = logging.getLogger("astraeus.agent")


class WorkerKeeping(AgentState):
    """The agent's workers, from their making to their end (a part of ``Agent``)."""

    # --- executors ------------------------------------------------------------------------

    async def _with_uid(self, worker_id: int, payload: dict[str, Any]) -> dict[str, Any]:
        """The start payload with the worker's own user id of the range (identity.py's
        free_uid: the same at every attempt), free among the kept workers and handed over from
        the workspace that last ran under it only once nothing of that one is left
        (agent/uid_handover.py); an id with something left is passed over for the next."""
        if not self.config.users.switch:
            return payload
        taken = {int(w.payload["uid"]) for w in self.workers.values() if "uid" in w.payload}
        workspace = int(payload.get("workspace_id") or 0)
        while True:
            try:
                uid = self.config.users.free_uid(taken, uid_seed(worker_id, payload))
            except LookupError:
                return payload  # none free: start() says so
            if not self.uid_ledger.same_workspace(uid, workspace):
                left = await asyncio.to_thread(uid_handover.hand_over, uid, self.shared_places)
                if left:
                    log.warning("user id %d not handed over, passed over: %s", uid, left[0])
                    taken.add(uid)
                    continue
                self.uid_ledger.record(uid, workspace)
            return {**payload, "uid": uid}

    def _new_worker(self, worker_id: int, payload: dict[str, Any]) -> Worker:
        log_ = WorkerLog(self.log_root, str(worker_id))
        folder = self.worker_root / local_name(worker_id, payload)
        if self.config.executor == "docker":
            drives = prepare.drive_folder(self.drive_root, payload, "x").parent
            container = docker.ContainerWorker(
                worker_id, payload, log_, folder, engine=self._engine(), drives=drives
            )
            container.users, container.install = self.config.users, self.config.install
            container.pids_limit = self.isolation.pids_max
            return container
        return self._process_worker(
            ProcessWorker(worker_id, payload, log_, folder, drive_root=self.drive_root)
        )

    def _process_worker(self, worker: ProcessWorker) -> ProcessWorker:
        c = self.config
        worker.users, worker.install = c.users, c.install
        worker.fill_roots, worker.mount_roots = c.fill_roots, c.mount_roots
        worker.isolation, worker.machine_memory = self.isolation, c.memory_bytes
        return worker

    def _adopt_worker(self, folder: Path) -> Worker | None:
        if docker.is_container_folder(folder):
            adopted = docker.ContainerWorker.adopt(folder, self.log_root, self._engine())
            if adopted is not None:
                adopted.drives = prepare.drive_folder(self.drive_root, adopted.payload, "x").parent
                adopted.users, adopted.install = self.config.users, self.config.install
                adopted.pids_limit = self.isolation.pids_max
            return adopted
        process = ProcessWorker.adopt(folder, self.log_root)
        if process is not None:
            process.drive_root = self.drive_root
            self._process_worker(process)
        return process

    def _engine(self) -> engines.Engine:
        return engines.engine_at(self.config.docker_socket)

    # --- starting up: the workers a previous agent left -----------------------------------

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

    # --- the network: what its workloads reach (agent/network.py) -------------------------

    @functools.cached_property
    def network(self) -> Network:
        """This agent's nftables table (started by ``Agent.run_forever``)."""
        c = self.config
        return Network(c.install, c.users.uids, c.server)

    @functools.cached_property
    def _resolved(self) -> dict[str, str]:
        return {}  # MASTER_ADDR names (and the gangs' machines') as addresses

    def _network_rules(self) -> None:
        """The rules as the workers kept now need them, the machine's listeners looked at
        again (also every network.REFRESH_SECONDS: agent/connection.py)."""
        self._expire_offers()
        if not self.network.enforced:
            return
        kept = [(w.payload, self._uid_of(w)) for w in self.workers.values()]
        self.network.update(gang_rendezvous(kept, self._resolved))

    def _uid_of(self, worker: Worker) -> int | None:
        with contextlib.suppress(LookupError, ValueError, AssertionError):
            identity = self.config.users.of_worker(worker.payload)
            return identity.uid if identity is not None else None
        return None

    # --- rank 0's MASTER_PORT -------------------------------------------------------------

    @functools.cached_property
    def _offers(self) -> dict[int, tuple[rendezvous.Claim, float]]:
        """Ports held for gangs whose MASTER_PORT was taken here: by port, with when the
        hold ends (rendezvous.OFFER_SECONDS after it was offered)."""
        return {}

    def _reserve_master_port(self, worker: Worker) -> bool:
        """Rank 0 of a gang holds its MASTER_PORT until it starts. A port another program
        holds ends the start as PORT_TAKEN (not the run's failure: issue 37 N3), with another
        port held for the gang's next placement here (offered_port)."""
        self._network_rules()
        environment = worker.payload.get("astraeus_environment") or {}
        if environment.get("RANK") != "0" or int(environment.get("WORLD_SIZE") or 1) < 2:
            return True
        port = int(environment.get("MASTER_PORT") or 0)
        if not port:
            return True
        held = self._taken_offer(port) or rendezvous.claim(port)
        if held is None:
            log.warning("MASTER_PORT %d of worker %s is held by another program", port, worker.name)
            self._ended_before_start(worker, self._port_taken(port, None))
            return False
        self.reserved[worker.worker_id] = held
        return True

    def _port_taken(self, port: int, code: int | None) -> Exit:
        """The end of a rank 0 whose MASTER_PORT another program holds, with a port the kernel
        picked held for the gang's next placement on this machine."""
        self._expire_offers()
        offer = rendezvous.claim_free()
        offered = None
        if offer is not None:
            self._offers[offer.port] = (offer, time.monotonic() + rendezvous.OFFER_SECONDS)
            offered = offer.port
        return Exit(code, EndCause.PORT_TAKEN, detail=str(port), offered_port=offered)

    def _expire_offers(self) -> None:
        """Ports offered that no gang came back for in time are let go."""
        for stale in [p for p, (_, until) in self._offers.items() if until < time.monotonic()]:
            self._offers.pop(stale)[0].end()

    def _taken_offer(self, port: int) -> rendezvous.Claim | None:
        """The port this agent offered, now given to a gang's rank 0 here."""
        offered = self._offers.pop(port, None)
        return offered[0] if offered is not None else None

    def _master_port_started(self, worker_id: int) -> None:
        """Its process binds the port now: the sockets go, the machine-wide claim stays."""
        self._network_rules()
        held = self.reserved.get(worker_id)
        if held is not None:
            held.started()

    def _release_master_port(self, worker_id: int) -> None:
        held = self.reserved.pop(worker_id, None)
        if held is not None:
            held.end()

    def _rank_0_refused(self, worker: Worker, exit: Exit) -> Exit:
        """A rank 0 whose process could not listen on its MASTER_PORT, which another user
        holds (it exited saying the address is in use, while another user listened there):
        PORT_TAKEN, as when the agent's own bind fails at its start."""
        environment = worker.payload.get("astraeus_environment") or {}
        if exit.cause != EndCause.EXITED or not exit.code or environment.get("RANK") != "0":
            return exit
        port = int(environment.get("MASTER_PORT") or 0)
        if not port or int(environment.get("WORLD_SIZE") or 1) < 2:
            return exit
        if not rendezvous.in_use_said(worker.log.snapshot()):
            return exit
        owners = rendezvous.listening(port)
        uid = self._uid_of(worker)
        if not owners or (uid is not None and owners == {uid}):
            return exit
        log.warning("MASTER_PORT %d of worker %s was taken by user %s", port, worker.name, owners)
        return self._port_taken(port, exit.code)

    # --- preparing: credentials and drives ------------------------------------------------

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

    # --- to the end -----------------------------------------------------------------------

    def _watch(self, worker: Worker) -> None:
        self._keep(asyncio.create_task(self._until_exit(worker)))

    async def _until_exit(self, worker: Worker) -> None:
        exit = self._rank_0_refused(worker, await worker.wait())
        # Its follows end with it, a deleted or replaced one's too (they hold the object).
        worker.exited.set()
        if self.workers.get(worker.worker_id) is not worker:
            return  # deleted meanwhile
        # Followers read to the end before the log is archived.
        await asyncio.sleep(0)
        mine = f"follow:{worker.worker_id}"
        for follow in [t for t in self.follows.values() if t.get_name() == mine]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(follow), 2)
        # Its last report and samples as it ended (a kill of its main process is seen by no
        # look), sent before its end.
        try:
            report = self.sampler.last_report(worker)
        except Exception:  # its end is sent whatever its progress file holds
            log.exception("the last read of %s's progress file failed", worker.worker_id)
            report = None
        if report is not None:
            self._send(progress=report)
        last = self.sampler.ended(
            worker,
            oom_killed=exit.cause == OOM_KILLED,
            at_ms=exit.at_ms,
            oom_kill_seen=exit.oom_kill_seen,
        )
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
        self._network_rules()
