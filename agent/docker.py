"""The Docker executor: each worker a container, run through the Docker Engine API.

``ContainerWorker`` offers what ``executor.ProcessWorker`` offers (keep, start, ended, alive,
wait, stop, release, adopt, environment, progress_file), plus what only a container has:
``prepare`` (the image pull, reported with how far it is, or the worker's end as a pull's
failure) and ``sample`` (its CPU, memory and OOM figures from the engine).

The agent talks to the engine over its unix socket (``/var/run/docker.sock``) with httpx; no
Docker SDK. Containers outlive the agent as shims do: each carries the labels
``astraeus.worker`` and ``astraeus.attempt``, and its id is written in the worker's runtime
folder, so a restarted agent finds it again (by the file, else by the labels).

Logs: the engine's log of the container (``GET /containers/<id>/logs``, followed, with
timestamps) is copied into the worker's ``WorkerLog`` as it comes, so tails, follows, the
failure snapshot and the archive work as for a process. The timestamp of the last entry copied
is kept in the runtime folder; a restarted agent asks again ``since`` that time and drops what
it already has (entries at or before it), so the log neither loses nor repeats lines, even
after ``WorkerLog`` cut its file back. Only an agent killed between writing a chunk and
recording its time repeats that one chunk. Unlike a process's, a container's stdout and stderr
reach the engine through two pipes, so lines printed at the same moment on both may be copied
in either order (as ``docker logs`` shows them).

The pure parts are functions in agent/engine_answers.py, tested without an engine: the create
body from a worker's start (``create_body``), the multiplexed log frames (``FrameReader``), the
container state to an end (``exit_of``), pull progress to a reason (``PullProgress``), stats to
metrics (``stats_metrics``). The Engine API client is agent/engine.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent import cgroups, code, prepare, shim
from agent.engine import (
    LONG,
    Engine,
    engine_at,
    said,
)
from agent.engine_answers import (
    CONTAINER,
    LOGGED_AT,
    LOST_BEFORE_START,
    NO_IMAGE,
    PROGRESS,
    PULL_REPORT_SECONDS,
    RETRY_SECONDS,
    RUN,
    SECRETS,
    SOCKET,
    CpuReading,
    EngineError,
    FrameError,
    FrameReader,
    PullProgress,
    container_environment,
    container_name,
    create_body,
    exit_of,
    new_output,
    pull_failed,
    since_param,
    stats_metrics,
    worker_filters,
)
from agent.executor import LOST, STOP_GRACE_SECONDS, EndCause, Exit, keep_start, kept_start
from agent.identity import WorkloadUsers
from agent.logs import WorkerLog
from agent.start import StartSpec

log = logging.getLogger("astraeus.agent")


_removals: set[asyncio.Task[None]] = set()


async def removals_done() -> None:
    """Wait for the removals ``release`` started (before the agent stops, say)."""
    await asyncio.gather(*_removals, return_exceptions=True)


def _read_text(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text().strip() or None
    return None


def _write_quickly(path: Path, text: str) -> None:
    """Readers see the old file or the new one; no fsync (the agent may die, not the disk)."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)


# Called while an image is pulled with how far it is ("2.1 GB of 3.4 GB"; "" before sizes).
PullReport = Callable[[str], Awaitable[None]]


@dataclass
class ContainerWorker:
    """One worker as a container: its start, its log, its container once started.

    Known on the machine by the server's id for it (labels, container names, folders): two
    workspaces' workers may share a name."""

    worker_id: int
    spec: StartSpec
    log: WorkerLog
    folder: Path
    engine: Engine = field(default_factory=engine_at)
    drives: Path | None = None  # <data>/drives unless given
    started: bool = False
    stopping: bool = False
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    cgroup: cgroups.WorkerCgroup | None = None  # the engine measures a container (sample())
    container_id: str | None = None
    image_env: list[str] | None = None
    running: bool = False
    cpu: CpuReading | None = None
    copying: asyncio.Task[None] | None = None
    # Credentials' values, in memory only (never in payload.json); given at start.
    secrets: dict[str, str] = field(default_factory=dict)
    users: WorkloadUsers = field(default_factory=WorkloadUsers)
    install: str = "default"  # names the agent's data folder: two agents may share an engine
    pids_limit: int = 0  # its processes and threads (--pids-limit); 0: none

    @property
    def key(self) -> str:
        """How its containers are labelled and named: this install's, this worker's."""
        return f"{self.install}-{self.worker_id}"

    @property
    def attempt(self) -> int:
        return self.spec.attempt

    @property
    def name(self) -> str:
        """The worker's name, for people (log lines of the agent)."""
        return self.spec.worker or str(self.worker_id)

    @property
    def image(self) -> str | None:
        return self.spec.image

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return self.spec.gpu_ids

    @property
    def memory_limit_bytes(self) -> int | None:
        return self.spec.memory_limit_bytes

    @property
    def run_folder(self) -> Path:
        return self.folder / RUN

    @property
    def progress_file(self) -> Path:
        return self.run_folder / PROGRESS

    def keep(self) -> None:
        """Write the start down: a worker at the barrier survives the agent too."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in (shim.EXIT, CONTAINER, LOGGED_AT):
            (self.folder / stale).unlink(missing_ok=True)
        shutil.rmtree(self.run_folder, ignore_errors=True)
        shutil.rmtree(self.folder / code.FOLDER, ignore_errors=True)  # an earlier attempt's
        self.folder.chmod(0o711)
        self.run_folder.mkdir()
        # The container's user may be anyone (an image's own), unless the agent chose it
        # (start: then the folder becomes that user's alone).
        self.run_folder.chmod(0o777)
        keep_start(self.folder, self.worker_id, self.spec)

    @classmethod
    def adopt(
        cls, folder: Path, log_root: Path, engine: Engine | None = None
    ) -> ContainerWorker | None:
        """The worker a previous agent left in this folder, or None when nothing is left.

        Its container is found again when it is waited for (``wait``), by the id written
        here or else by its labels; its log is copied on from where the last agent stopped.
        """
        kept = kept_start(folder)
        if kept is None:
            return None
        worker_id, spec = kept
        worker = cls(worker_id, spec, WorkerLog(log_root, str(worker_id)), folder)
        if engine is not None:
            worker.engine = engine
        worker.container_id = _read_text(folder / CONTAINER)
        worker.started = worker.container_id is not None or (folder / shim.EXIT).exists()
        return worker

    def environment(self) -> dict[str, str]:
        return container_environment(self.spec, self.image_env, self.secrets)

    # --- before the barrier -------------------------------------------------------------

    async def prepare(self, report: PullReport | None = None) -> Exit | None:
        """Have the image on this machine: None when it is, else how the worker ended.

        While pulling, ``report`` is called at once (the caller reports the worker Pulling its
        image), then every ten seconds with how far the download is. A failed pull is the
        worker's end (the server says "ErrImagePull: <the engine's message>"), also written
        down for a restarted agent. Run it in a task of its own: a pull takes minutes.
        """
        try:
            if self.image is None:
                raise EngineError(0, NO_IMAGE)
            found = await self.engine.image(self.image)
            if found is None:
                found = await self._pull(self.image, report)
        except (EngineError, httpx.TransportError) as error:
            failed = pull_failed(said(error))
            shim.record_exit(self.folder, failed)
            return failed
        self.image_env = list((found.get("Config") or {}).get("Env") or [])
        return None

    async def _pull(self, image: str, report: PullReport | None) -> dict[str, Any]:
        progress = PullProgress(image)
        if report is not None:
            await report(progress.done())
        pulling = asyncio.create_task(self.engine.pull(image, progress))
        try:
            while not pulling.done():
                await asyncio.wait({pulling}, timeout=PULL_REPORT_SECONDS)
                if report is not None and not pulling.done():
                    await report(progress.done())
        finally:
            pulling.cancel()  # the caller gave up (the worker was stopped): so does the pull
        pulling.result()
        if progress.error is not None:
            raise EngineError(0, progress.error)
        found = await self.engine.image(image)
        if found is None:
            raise EngineError(404, f"{image}: not on this machine after its pull")
        return found

    # --- running --------------------------------------------------------------------------

    async def start(self) -> None:
        """Create and start the container; the log begins anew.

        An engine that refuses (an unknown user, a missing GPU driver, a command not in the
        image) ends the worker with the code the engine gives the container (127 command not
        found, 126 not executable, 128 otherwise) and its message as the log.
        """
        self.log.begin()
        self.started = True
        if self.image_env is None and self.ended() is None:
            await self.prepare()  # not prepared by this agent: pulled without a report
        if self.ended() is not None:
            return
        try:
            await self._create_and_start()
        except (EngineError, httpx.TransportError) as error:
            code = 128
            with contextlib.suppress(EngineError, httpx.TransportError):
                state = await self._state()
                ended = exit_of(state) if state else None
                code = ended.code if ended is not None and ended.code else code
            self._not_started(said(error), code)

    async def _create_and_start(self) -> None:
        for stale in await self.engine.containers(worker_filters(self.key)):
            await self.engine.remove(stale["Id"])  # an earlier attempt, or a half start
        credentials = self.spec.credentials
        user = None
        try:
            identity = self.users.of_worker(self.spec)
        except (LookupError, ValueError) as error:
            raise EngineError(400, str(error.args[0])) from None
        if self.spec.code:  # unpacked while it prepared (agent/code.py)
            staged = self.folder / code.FOLDER
            if not staged.is_dir():
                raise EngineError(400, "its code was not unpacked on this machine")
            owner = (identity.uid, identity.gid) if identity is not None else None
            await asyncio.to_thread(code.hand_over, staged, self.run_folder / code.FOLDER, owner)
        if identity is not None:
            # As for a process: a user of its own, never root; its run folder its alone.
            user = f"{identity.uid}:{identity.gid}"
            os.chown(self.run_folder, identity.uid, identity.gid)
            self.run_folder.chmod(0o700)
            owner = (identity.uid, identity.gid)
            prepare.write_secret_files(
                credentials, self.secrets, self.run_folder / SECRETS, owner=owner
            )
        else:
            prepare.write_secret_files(
                credentials, self.secrets, self.run_folder / SECRETS, mode=0o444
            )
        body = create_body(
            self.key,
            self.spec,
            run_folder=self.run_folder,
            drives=self.drives or self.folder.parent.parent / "drives",
            image_env=self.image_env,
            secrets=self.secrets,
            user=user,
            pids_limit=self.pids_limit,
        )
        created = await self.engine.call(
            "POST",
            "/containers/create",
            params={"name": container_name(self.key, self.attempt)},
            body=body,
        )
        self.container_id = str(created["Id"])
        shim.write_atomically(self.folder / CONTAINER, self.container_id)
        await self.engine.call("POST", f"/containers/{self.container_id}/start")
        self.running = True
        self._copy_logs()

    def _not_started(self, message: str, code: int) -> None:
        """The engine refused: its message is the log, as a shell's would be for a process."""
        self.log.append(f"{message}\n".encode())
        cause = EndCause.NOT_FOUND if code == 127 else EndCause.EXITED
        shim.record_exit(self.folder, Exit(code, cause))

    async def _state(self) -> dict[str, Any] | None:
        if self.container_id is None:
            return None
        try:
            inspected = await self.engine.call("GET", f"/containers/{self.container_id}/json")
        except EngineError as error:
            if error.status == 404:
                return None
            raise
        state: dict[str, Any] = inspected.get("State") or {}
        return state

    async def _container(self) -> str | None:
        """The container's id: as written down, else found by its labels."""
        if self.container_id is None:
            found = await self.engine.containers(worker_filters(self.key, self.attempt))
            if found:
                self.container_id = str(found[0]["Id"])
                shim.write_atomically(self.folder / CONTAINER, self.container_id)
        return self.container_id

    def ended(self) -> Exit | None:
        """How the worker ended, once written down (by ``wait``, or a failed pull or start)."""
        return shim.recorded_exit(self.folder)

    def alive(self) -> bool:
        """Whether the container was running when the engine last said (no call here)."""
        return self.running and self.ended() is None

    async def wait(self) -> Exit:
        """Wait for the container's end (it may have been started by an earlier agent)."""
        while True:
            ended = self.ended()
            if ended is not None:
                await self._logs_copied()
                return ended
            try:
                ended = await self._wait_once()
            except httpx.TransportError as error:  # the engine restarts: ask again
                log.warning("docker engine unreachable while waiting for %s: %s", self.name, error)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            await self._logs_copied()
            shim.record_exit(self.folder, ended)
            return ended

    async def _wait_once(self) -> Exit:
        container = await self._container()
        state = await self._state() if container is not None else None
        if state is None:
            return Exit(None, LOST)
        self._copy_logs()  # also the output of one that ended while the agent was away
        if state.get("Running"):
            self.running = True
            with contextlib.suppress(EngineError):
                await self.engine.call(
                    "POST",
                    f"/containers/{container}/wait",
                    params={"condition": "not-running"},
                    limit=LONG,
                )
            state = await self._state()
        self.running = False
        if state is None:
            return Exit(None, LOST)
        return exit_of(state) or Exit(None, LOST_BEFORE_START)

    async def stop(self) -> None:
        """The engine's stop: SIGTERM, SIGKILL after the grace period; then wait for the end."""
        self.stopping = True
        if not self.started or self.ended() is not None:
            return
        container = await self._container()
        if container is None:
            return
        with contextlib.suppress(EngineError):
            await self.engine.call(
                "POST",
                f"/containers/{container}/stop",
                params={"t": str(int(STOP_GRACE_SECONDS))},
                limit=STOP_GRACE_SECONDS + 30.0,
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait(), STOP_GRACE_SECONDS)

    def release(self) -> None:
        """The worker is gone and reported: its container and runtime folder go too.

        The removal runs on in the background (the agent's call is not async); one an agent
        stopped before it finished is done by ``remove_orphans`` at the next start.
        """
        if self.copying is not None:
            self.copying.cancel()
        if self.container_id is not None:
            with contextlib.suppress(RuntimeError):  # no loop running: left to remove_orphans
                task = asyncio.get_running_loop().create_task(self.engine.remove(self.container_id))
                _removals.add(task)
                task.add_done_callback(_removals.discard)
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- logs -----------------------------------------------------------------------------

    def _copy_logs(self) -> None:
        if self.copying is None or self.copying.done():
            self.copying = asyncio.create_task(self._copy(), name=f"docker-logs:{self.name}")

    async def _logs_copied(self) -> None:
        """The engine ends a followed log when the container stops; wait for its last lines."""
        if self.copying is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self.copying), STOP_GRACE_SECONDS)
        self.copying.cancel()

    async def _copy(self) -> None:
        """Copy the engine's log into the WorkerLog until the container stops."""
        while self.container_id is not None:
            recorded = _read_text(self.folder / LOGGED_AT)  # also after a broken stream
            try:
                await self._copy_from(self.container_id, int(recorded) if recorded else None)
                state = await self._state()
                if state is None or not state.get("Running"):
                    return  # the engine ends a followed log when the container stops
            except EngineError as error:
                if error.status == 404:
                    return
                log.warning("docker log of %s: %s", self.name, error.message)
            except (httpx.TransportError, FrameError) as error:
                log.warning("docker log of %s: %s", self.name, error)
            await asyncio.sleep(RETRY_SECONDS)

    async def _copy_from(self, container: str, after: int | None) -> None:
        """One followed read of the engine's log, from after the last entry copied."""
        params = {"follow": "1", "stdout": "1", "stderr": "1", "timestamps": "1"}
        if after is not None:
            params["since"] = since_param(after)
        async with self.engine.stream("GET", f"/containers/{container}/logs", params) as answer:
            reader = FrameReader()
            async for chunk in answer.aiter_bytes():
                data, after, errors = new_output(reader.feed(chunk), after)
                if data:  # in a thread: a log cut back moves up to 32 MiB
                    await asyncio.to_thread(self.log.append, data)
                    _write_quickly(self.folder / LOGGED_AT, str(after))
                for error in errors:
                    log.warning("docker log of %s: %s", self.name, error)

    # --- metrics --------------------------------------------------------------------------

    async def sample(self) -> dict[str, float]:
        """The container's figures now (metric name → value); empty when it is not running."""
        if not self.running or self.container_id is None:
            return {}
        try:
            stats = await self.engine.call(
                "GET",
                f"/containers/{self.container_id}/stats",
                params={"stream": "false", "one-shot": "true"},
            )
        except (EngineError, httpx.TransportError):
            return {}
        metrics, self.cpu = stats_metrics(stats or {}, self.cpu, self.spec.memory_limit_bytes)
        return metrics


def on_engine(socket: str = SOCKET) -> bool:
    """Whether a Docker engine's socket is on this machine."""
    return os.path.exists(socket)


def is_container_folder(folder: Path) -> bool:
    """Whether a worker's runtime folder was kept by a ContainerWorker (not a ProcessWorker),
    so a restarted agent takes each worker back with the executor that started it."""
    return (folder / RUN).is_dir()
