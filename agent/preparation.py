"""A worker's preparation up to the gang barrier: its credentials' values asked of the server
until it has them all, its drives filled (agent/prepare.py), a container's image pulled; then
READY. What it waits for is reported as it changes (a kind and a name: the server writes the
sentence); what cannot be had ends it before its start."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from astraeus.agent.v1 import agent_pb2

from agent import code, docker, prepare
from agent.config import AgentConfig
from agent.executor import EndCause, Exit, ProcessWorker
from agent.state import Outgoing, Worker

# A fetch's progress is told at most this often.
CODE_REPORT_S = 5.0


class Preparation:
    """The workers being prepared, by id, and the secret values each waits for; ``ended``: a
    worker's end before its start (the keeper's, agent/workers.py)."""

    def __init__(
        self, config: AgentConfig, outgoing: Outgoing, ended: Callable[[Worker, Exit], None]
    ) -> None:
        self.config = config
        self.outgoing = outgoing
        self.ended = ended
        self.preparing: dict[int, asyncio.Task[None]] = {}
        self.secret_answers: dict[int, asyncio.Future[agent_pb2.SecretValues]] = {}
        server = code.Server(
            lambda: config.transport.channel(config.server),
            config.kept_credential,
            config.machine,
        )
        self.code = code.CodeCache(config.code_root, server, config.prepare_poll_seconds)

    def cancel(self, worker_id: int) -> None:
        """Its preparation stops (a STOP or a DELETE before its start)."""
        preparing = self.preparing.pop(worker_id, None)
        if preparing is not None:
            preparing.cancel()

    def answered(self, values: agent_pb2.SecretValues) -> None:
        """The server's answer to a worker's secret request."""
        waiting = self.secret_answers.pop(values.worker_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(values)

    def begin(self, worker: Worker) -> None:
        """Prepare what the worker needs, then wait at the gang barrier (READY)."""
        nothing_to_do = (
            not worker.spec.credentials
            and not worker.spec.code
            and not prepare.drives_to_fill(worker.spec, self.config.drive_root)
        )
        if nothing_to_do and isinstance(worker, ProcessWorker):
            self.outgoing.report(worker, agent_pb2.WORKER_STATE_READY)
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
                self.outgoing.report(worker, agent_pb2.WORKER_STATE_PREPARING, waits=said)

        credentials = worker.spec.credentials
        while credentials:
            answer = await self._ask_secrets(worker)
            if answer is not None and not answer.missing:
                worker.secrets = dict(answer.values)
                break
            missing = answer.missing[0] if answer is not None else credentials[0].secret
            preparing(agent_pb2.WAIT_SECRET, missing)
            await asyncio.sleep(self.config.prepare_poll_seconds)
        for drive, source, folder in prepare.drives_to_fill(worker.spec, self.config.drive_root):
            preparing(agent_pb2.WAIT_DRIVE, drive)
            problem = await asyncio.to_thread(
                prepare.fill_drive,
                source,
                folder,
                allowed_roots=self.config.fill_roots,
                gid=worker.workspace_gid if isinstance(worker, ProcessWorker) else None,
            )
            if problem is not None:
                self.ended(worker, Exit(None, EndCause.NOT_STARTED, detail=problem))
                return
        if worker.spec.code and not await self._unpack_code(worker, worker.spec.code):
            return
        if isinstance(worker, docker.ContainerWorker):
            image = (agent_pb2.WAIT_IMAGE, worker.image or "")

            async def pulling(done: str) -> None:
                self.outgoing.report(
                    worker, agent_pb2.WORKER_STATE_PULLING, waits=image, detail=done
                )

            failed = await worker.prepare(pulling)
            if failed is not None:
                self.ended(worker, failed)
                return
        self.outgoing.report(worker, agent_pb2.WORKER_STATE_READY)

    async def _unpack_code(self, worker: Worker, digest: str) -> bool:
        """Its run's code fetched (or found in the cache) and unpacked into its runtime folder,
        reported Preparing ("Fetching its code sha256:…: 3.0 MiB of 12.0 MiB") while it comes;
        False when it cannot be had: the worker has ended."""
        name = f"{digest[: len(code.PREFIX) + 12]}…"
        told = 0.0

        def progress(done: int, total: int) -> None:
            nonlocal told
            if done and time.monotonic() - told < CODE_REPORT_S and done < total:
                return
            told = time.monotonic()
            detail = f"{code.mib(done)} of {code.mib(total)}" if total else ""
            waits = (agent_pb2.WAIT_CODE, name)
            self.outgoing.report(
                worker, agent_pb2.WORKER_STATE_PREPARING, waits=waits, detail=detail
            )

        try:
            into = worker.folder / code.FOLDER
            await self.code.unpack(worker.worker_id, worker.attempt, digest, into, progress)
        except code.CodeRefused as refused:
            self.ended(worker, Exit(None, EndCause.NOT_STARTED, detail=str(refused)))
            return False
        return True

    async def _ask_secrets(self, worker: Worker) -> agent_pb2.SecretValues | None:
        """The worker's secret values from the server; None when it does not answer in time."""
        answer: asyncio.Future[agent_pb2.SecretValues] = asyncio.get_running_loop().create_future()
        key = worker.worker_id
        self.secret_answers[key] = answer
        asked = agent_pb2.SecretRequest(worker_id=key, attempt=worker.attempt)
        self.outgoing.send(durable=False, secret_request=asked)
        try:
            return await asyncio.wait_for(answer, self.config.prepare_poll_seconds * 2)
        except TimeoutError:
            return None
        finally:
            if self.secret_answers.get(key) is answer:
                del self.secret_answers[key]
