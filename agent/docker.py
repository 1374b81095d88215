"""The Docker executor: each worker a container, run through the Docker Engine API.

``ContainerWorker`` offers what ``executor.ProcessWorker`` offers (keep, start, ended, alive,
wait, stop, release, adopt, environment, progress_file), plus what only a container has:
``prepare`` (the image pull, reported as "Pulling image …", or the worker's end as
"ErrImagePull: …") and ``sample`` (its CPU, memory and OOM figures from the engine).

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

The pure parts are functions, tested without an engine: the create body from a start payload
(``create_body``), the multiplexed log frames (``FrameReader``), the container state to an end
(``exit_of``), pull progress to a reason (``PullProgress``), stats to metrics
(``stats_metrics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from agent import cgroups, prepare, shim
from agent.executor import LOST, OOM_KILLED, PAYLOAD, SDK, STOP_GRACE_SECONDS, EndCause, Exit
from agent.identity import WorkloadUsers
from agent.logs import WorkerLog

log = logging.getLogger("astraeus.agent")

SOCKET = "/var/run/docker.sock"
MIN_API = (1, 43)
# The newest API version this code was written against; a newer engine is spoken to in this
# version, an engine whose oldest is newer than this in its oldest.
PREFERRED_API = (1, 47)
LABEL_WORKER = "astraeus.worker"
LABEL_ATTEMPT = "astraeus.attempt"
CONTAINER = "container"  # the container's id, in the worker's runtime folder
LOGGED_AT = "logged_at"  # the engine's timestamp of the last log entry copied
RUN = "run"  # the folder shared with the container (its progress file, its secret files)
SECRETS = "secrets"
CONTAINER_RUN = "/astraeus/run"
CONTAINER_SDK = "/astraeus/sdk"
PROGRESS = "progress"
# NCCL and PyTorch's DataLoader share memory through /dev/shm; the engine's 64 MiB default
# makes an unmodified DDP script fail. Its use is charged to the memory limit all the same.
SHM_BYTES = 8 * 2**30
PULL_REPORT_SECONDS = 10.0
RETRY_SECONDS = 1.0
LOST_BEFORE_START = EndCause.LOST_BEFORE_START
NO_IMAGE = "the run names no image"  # said as ErrImagePull: the run names no image


# --- the engine's answers, as pure functions -------------------------------------------------


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def api_version(server: str, server_min: str | None) -> str:
    """The API version to speak: ours where the engine has it, else the nearest it has."""
    newest = _version(server)
    if newest < MIN_API:
        raise EngineError(0, f"the Docker engine's API {server} is older than 1.43")
    chosen = min(newest, PREFERRED_API)
    if server_min is not None:
        chosen = max(chosen, _version(server_min))
    return f"{chosen[0]}.{chosen[1]}"


def image_reference(image: str) -> tuple[str, str]:
    """``fromImage`` and ``tag`` for a pull; never an empty tag, which pulls every tag."""
    if "@" in image:
        name, _, digest = image.partition("@")
        return name, digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:  # a colon before the last slash is a registry's port
        return image[:colon], image[colon + 1 :]
    return image, "latest"


def pulling(image: str) -> str:
    return f"Pulling image {image}"


def pull_failed(message: str) -> Exit:
    """An image that could not be pulled (the server says "ErrImagePull: <the engine's
    words>"); it never ran: no exit code."""
    return Exit(None, EndCause.IMAGE_PULL, detail=message.strip())


def _size(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


class PullProgress:
    """Reads ``POST /images/create``'s progress lines: bytes downloaded, or the engine's error.

    A failed pull still answers 200; its last line carries ``errorDetail``.
    """

    def __init__(self, image: str) -> None:
        self.image = image
        self.layers: dict[str, tuple[int, int]] = {}  # layer → (downloaded, size)
        self.error: str | None = None

    def feed(self, event: dict[str, Any]) -> None:
        detail = event.get("errorDetail") or {}
        if detail or event.get("error"):
            self.error = str(detail.get("message") or event.get("error") or "pull failed")
            return
        layer, status = event.get("id"), event.get("status") or ""
        if not layer:
            return
        progress = event.get("progressDetail") or {}
        _, size = self.layers.get(layer, (0, 0))
        if status == "Downloading" and progress.get("total"):
            self.layers[layer] = (int(progress.get("current") or 0), int(progress["total"]))
        elif status in ("Download complete", "Pull complete", "Already exists") and size:
            self.layers[layer] = (size, size)

    def reason(self) -> str:
        """The reason while pulling: how far the download is, once the engine says."""
        size = sum(total for _, total in self.layers.values())
        if not size:
            return pulling(self.image)
        done = sum(current for current, _ in self.layers.values())
        return f"{pulling(self.image)}: {_size(done)} of {_size(size)}"


def exit_of(state: dict[str, Any]) -> Exit | None:
    """How a container ended, from its inspected ``State``; None when it never started.

    A container killed for memory ended with OOMKilled whatever its own exit code; one whose
    start failed stays "created" with the engine's code (127 command not found, 126 not
    executable, 128 otherwise) and the error beside it.
    """
    if state.get("OOMKilled"):
        return Exit(137, OOM_KILLED)
    code = int(state.get("ExitCode") or 0)
    if state.get("Status") == "created" and code == 0:
        return None
    return Exit(code, EndCause.EXITED)


STDIN, STDOUT, STDERR, SYSTEMERR = 0, 1, 2, 3
_HEADER = struct.Struct(">BxxxI")


class FrameError(ValueError):
    """The bytes are not the engine's multiplexed stream (a container with a TTY?)."""


class FrameReader:
    """Splits the engine's multiplexed stdout/stderr back into frames, whatever the chunking.

    Each frame is an 8-byte header (stream, three zero bytes, the payload's size as a big-endian
    uint32) and its payload; HTTP chunks cut frames anywhere.
    """

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buffer += data
        frames = []
        while len(self.buffer) >= _HEADER.size:
            if self.buffer[0] > SYSTEMERR or any(self.buffer[1:4]):
                raise FrameError(f"not a multiplexed stream header: {bytes(self.buffer[:8])!r}")
            stream, size = _HEADER.unpack_from(self.buffer)
            end = _HEADER.size + size
            if len(self.buffer) < end:
                break
            frames.append((stream, bytes(self.buffer[_HEADER.size : end])))
            del self.buffer[:end]
        return frames


def timestamp_ns(stamp: str) -> int:
    """An engine timestamp (RFC 3339, nanoseconds) as integer epoch nanoseconds."""
    main, dot, rest = stamp.partition(".")
    digits = ""
    if dot:
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        zone = rest[len(digits) :]
    else:
        main, zone = main[:19], main[19:]
    zone = "+00:00" if zone in ("Z", "z", "") else zone
    seconds = int(datetime.fromisoformat(main + zone).timestamp())
    return seconds * 10**9 + int((digits or "0").ljust(9, "0")[:9])


def since_param(ns: int) -> str:
    """The ``since`` query value for a time in epoch nanoseconds (seconds.nanoseconds)."""
    return f"{ns // 10**9}.{ns % 10**9:09d}"


def split_timestamp(payload: bytes) -> tuple[int | None, bytes]:
    """A log entry asked with ``timestamps=1``: its time and its text."""
    stamp, space, text = payload.partition(b" ")
    if not space:
        return None, payload
    try:
        return timestamp_ns(stamp.decode()), text
    except ValueError:
        return None, payload


def new_output(
    frames: Iterable[tuple[int, bytes]], after: int | None
) -> tuple[bytes, int | None, list[str]]:
    """The worker's output in the frames, entries at or before ``after`` left out (already
    copied); the last entry's time; and the engine's own errors in the stream."""
    out = bytearray()
    errors = []
    for stream, payload in frames:
        if stream == SYSTEMERR:
            errors.append(payload.decode(errors="replace").strip())
            continue
        at, text = split_timestamp(payload)
        if at is not None:
            if after is not None and at <= after:
                continue
            after = at
        out += text
    return bytes(out), after, errors


@dataclass(frozen=True)
class CpuReading:
    """The container's CPU time used (ns) at the engine's time of reading (ns)."""

    used_ns: int
    read_ns: int


def stats_metrics(
    stats: dict[str, Any], previous: CpuReading | None, memory_limit: int | None
) -> tuple[dict[str, float], CpuReading | None]:
    """One ``GET /containers/<id>/stats?stream=false&one-shot=true`` answer as the seed's metrics.

    CPU cores are the CPU time used since the previous reading over the time between them, as
    the process executor measures them. Memory used is what is charged to the container (the
    engine's ``usage``: cgroup v2 memory.current, v1 usage_in_bytes), as for a process; its
    limit is the worker's own (the engine says the machine's memory when there is none). OOM
    kills: on cgroup v2 the engine reports memory.events' ``oom`` count as ``failcnt``
    (omitted when 0); on v1 ``failcnt`` counts every time the limit was reached, so the count
    stays absent there. Network bytes, summed over the container's interfaces, exist only
    where the container has a network of its own: with the host's (``NetworkMode: host``) the
    engine omits ``networks`` and so do we.
    """
    metrics: dict[str, float] = {}
    reading = previous
    cpu = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    read = stats.get("read")
    if cpu.get("total_usage") is not None and read:
        reading = CpuReading(int(cpu["total_usage"]), timestamp_ns(read))
        if previous is not None and reading.read_ns > previous.read_ns:
            used = max(reading.used_ns - previous.used_ns, 0)
            metrics["task_cpu_usage_cores"] = used / (reading.read_ns - previous.read_ns)
    memory = stats.get("memory_stats") or {}
    if memory.get("usage") is not None:
        metrics["task_memory_used_bytes"] = float(memory["usage"])
    if memory_limit:
        metrics["task_memory_limit_bytes"] = float(memory_limit)
    if "anon" in (memory.get("stats") or {}):  # cgroup v2's memory.stat
        metrics["task_oom_kills_total"] = float(memory.get("failcnt") or 0)
    networks = stats.get("networks")
    if networks:
        rx = sum(int(n.get("rx_bytes") or 0) for n in networks.values())
        tx = sum(int(n.get("tx_bytes") or 0) for n in networks.values())
        metrics["task_network_receive_bytes_total"] = float(rx)
        metrics["task_network_transmit_bytes_total"] = float(tx)
    return metrics, reading


def _image_variable(image_env: Iterable[str] | None, name: str) -> str | None:
    for item in image_env or ():
        key, _, value = item.partition("=")
        if key == name:
            return value
    return None


def container_environment(
    payload: dict[str, Any],
    image_env: Iterable[str] | None = None,
    secrets: dict[str, str] | None = None,
) -> dict[str, str]:
    """The worker's variables in its container: the ProcessWorker's composition, without the
    agent's own environment (the image brings its own).

    The run's variables, then Astraeus' (rank, master, …), then where to report progress. The
    container sees only its own GPUs, numbered from 0, so CUDA_VISIBLE_DEVICES names those,
    not the machine's indexes. The progress SDK is put last on PYTHONPATH, after the run's
    own or else the image's.
    """
    env: dict[str, str] = {}
    env.update(payload.get("environment") or {})
    env.update(
        prepare.credential_variables(
            payload.get("credentials") or [], secrets or {}, f"{CONTAINER_RUN}/{SECRETS}"
        )
    )
    env.update(payload.get("astraeus_environment") or {})
    gpus = payload.get("gpu_ids") or []
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
    env["ASTRAEUS_PROGRESS_FILE"] = f"{CONTAINER_RUN}/{PROGRESS}"
    own = env.get("PYTHONPATH") or _image_variable(image_env, "PYTHONPATH")
    env["PYTHONPATH"] = ":".join(p for p in (own, CONTAINER_SDK) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def container_name(worker: str, attempt: int) -> str:
    return f"astraeus-{worker}-{attempt}"


def worker_filters(worker: str | None = None, attempt: int | None = None) -> str:
    """The ``filters`` of ``GET /containers/json`` that find Astraeus' containers."""
    labels = [LABEL_WORKER if worker is None else f"{LABEL_WORKER}={worker}"]
    if attempt is not None:
        labels.append(f"{LABEL_ATTEMPT}={attempt}")
    return json.dumps({"label": labels})


def create_body(
    worker: str,
    payload: dict[str, Any],
    *,
    run_folder: Path,
    drives: Path,
    image_env: Iterable[str] | None = None,
    sdk: Path = SDK,
    secrets: dict[str, str] | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """``POST /containers/create``'s body for a worker's start payload. ``user`` (uid:gid) is
    who it runs as where the agent chose (agent/identity.py); else the spec's, or the image's.
    Setuid programs in the image give it nothing (no-new-privileges)."""
    host: dict[str, Any] = {
        # Gangs reach rank 0 at MASTER_ADDR (its machine's advertised address) and MASTER_PORT,
        # which its agent holds until the container starts (agent/rendezvous.py).
        "NetworkMode": "host",
        # An init as PID 1 passes the stop's SIGTERM on (PID 1 ignores it unless it handles it).
        "Init": True,
        "ShmSize": SHM_BYTES,
        # No memlock ulimit of our own: RDMA hosts set it in the daemon's default-ulimits, and
        # an engine that may not raise it would refuse to start every container.
        "Binds": [f"{run_folder}:{CONTAINER_RUN}", f"{sdk}:{CONTAINER_SDK}:ro"],
        # The engine keeps a bounded log of its own; ours is the WorkerLog.
        "LogConfig": {"Type": "local", "Config": {}},
        "SecurityOpt": ["no-new-privileges"],
    }
    for mount in payload.get("mounts") or []:
        bind = f"{drives / mount['drive']}:{mount['path']}"
        host["Binds"].append(bind + (":ro" if mount.get("read_only") else ""))
    memory = payload.get("memory_limit_bytes")
    if memory:
        host["Memory"] = int(memory)
        host["MemorySwap"] = int(memory)  # the limit is the limit: no swap beyond it
    if payload.get("cpu"):
        host["NanoCpus"] = round(float(payload["cpu"]) * 1e9)
    gpus = payload.get("gpu_ids") or []
    if gpus:
        host["DeviceRequests"] = [
            {"Driver": "nvidia", "DeviceIDs": [str(g) for g in gpus], "Capabilities": [["gpu"]]}
        ]
    env = container_environment(payload, image_env, secrets)
    body: dict[str, Any] = {
        "Image": payload.get("image"),
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Labels": {LABEL_WORKER: worker, LABEL_ATTEMPT: str(int(payload.get("attempt", 0)))},
        "Tty": False,
        "OpenStdin": False,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "HostConfig": host,
    }
    if payload.get("command"):
        body["Cmd"] = [str(a) for a in payload["command"]]
    if user or payload.get("user"):
        body["User"] = user or str(payload["user"])
    if payload.get("working_dir"):
        body["WorkingDir"] = str(payload["working_dir"])
    return body


def orphans(containers: Iterable[dict[str, Any]], kept: Collection[str]) -> list[str]:
    """Ids of Astraeus' containers (``GET /containers/json``) whose worker this agent no
    longer keeps: released while the removal did not finish (the agent stopped meanwhile)."""
    return [
        c["Id"]
        for c in containers
        if (c.get("Labels") or {}).get(LABEL_WORKER) not in kept
        and LABEL_WORKER in (c.get("Labels") or {})
    ]


# --- the engine ----------------------------------------------------------------------------


class EngineError(Exception):
    """The engine answered with an error: its status and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _said(error: Exception) -> str:
    """What went wrong, in the engine's words, or how the engine could not be reached."""
    if isinstance(error, EngineError):
        return error.message
    return f"cannot reach the Docker engine: {error or type(error).__name__}"


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message") or response.text).strip()
    except ValueError:
        return response.text.strip() or response.reason_phrase


LONG = httpx.Timeout(30.0, read=None)  # waits, follows and pulls last as long as they last


class Engine:
    """The Docker Engine API over its unix socket, one client per event loop."""

    def __init__(self, socket: str = SOCKET) -> None:
        self.socket = socket
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._prefix: str | None = None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            transport = httpx.AsyncHTTPTransport(uds=self.socket)
            self._client = httpx.AsyncClient(
                transport=transport, base_url="http://docker", timeout=30.0
            )
            self._loop, self._prefix = loop, None
        return self._client

    async def _base(self) -> str:
        client = self._http()
        if self._prefix is None:
            answer = (await client.get("/version")).json()
            version = api_version(str(answer["ApiVersion"]), answer.get("MinAPIVersion"))
            self._prefix = f"/v{version}"
        return self._prefix

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        limit: httpx.Timeout | float = 30.0,
    ) -> Any:
        """One request; its JSON answer (None when empty); an EngineError for an error."""
        url = await self._base() + path
        response = await self._http().request(method, url, params=params, json=body, timeout=limit)
        if response.status_code >= 400:
            raise EngineError(response.status_code, _message(response))
        return response.json() if response.content else None

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, path: str, params: dict[str, Any]
    ) -> AsyncIterator[httpx.Response]:
        url = await self._base() + path
        async with self._http().stream(method, url, params=params, timeout=LONG) as response:
            if response.status_code >= 400:
                await response.aread()
                raise EngineError(response.status_code, _message(response))
            yield response

    async def image(self, image: str) -> dict[str, Any] | None:
        """The image's inspection, or None when this machine does not have it."""
        try:
            answer: dict[str, Any] = await self.call("GET", f"/images/{image}/json")
            return answer
        except EngineError as error:
            if error.status == 404:
                return None
            raise

    async def pull(self, image: str, progress: PullProgress) -> None:
        """Pull, feeding each progress line to ``progress``; an error ends up in it."""
        from_image, tag = image_reference(image)
        params = {"fromImage": from_image, "tag": tag}
        try:
            async with self.stream("POST", "/images/create", params) as response:
                async for line in response.aiter_lines():
                    if line.strip():
                        with contextlib.suppress(ValueError):
                            progress.feed(json.loads(line))
        except EngineError as error:
            progress.error = error.message

    async def containers(self, filters: str) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = await self.call(
            "GET", "/containers/json", params={"all": "1", "filters": filters}
        )
        return answer

    async def remove(self, container: str) -> None:
        """Remove it, running or not, if the engine can; it may be gone already."""
        with contextlib.suppress(EngineError, httpx.TransportError):
            await self.call(
                "DELETE", f"/containers/{container}", params={"force": "1"}, limit=120.0
            )


_engines: dict[str, Engine] = {}


def engine_at(socket: str = SOCKET) -> Engine:
    """The agent's one Engine for a socket, shared by its workers."""
    return _engines.setdefault(socket, Engine(socket))


_removals: set[asyncio.Task[None]] = set()


async def removals_done() -> None:
    """Wait for the removals ``release`` started (before the agent stops, say)."""
    await asyncio.gather(*_removals, return_exceptions=True)


async def remove_orphans(engine: Engine, kept: Collection[str], install: str) -> list[str]:
    """Remove this install's containers whose workers this agent no longer keeps (after adopt);
    another agent's on the same engine are not its to remove."""
    ours = [
        c
        for c in await engine.containers(worker_filters())
        if str((c.get("Labels") or {}).get(LABEL_WORKER, "")).startswith(f"{install}-")
    ]
    gone = orphans(ours, kept)
    for container in gone:
        await engine.remove(container)
    return gone


# --- the worker ----------------------------------------------------------------------------


def _read_text(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text().strip() or None
    return None


def _write_quickly(path: Path, text: str) -> None:
    """Readers see the old file or the new one; no fsync (the agent may die, not the disk)."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)


PullReport = Callable[[str], Awaitable[None]]


@dataclass
class ContainerWorker:
    """One worker as a container: its start payload, its log, its container once started.

    Known on the machine by the server's id for it (labels, container names, folders): two
    workspaces' workers may share a name."""

    worker_id: int
    payload: dict[str, Any]
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

    @property
    def key(self) -> str:
        """How its containers are labelled and named: this install's, this worker's."""
        return f"{self.install}-{self.worker_id}"

    @property
    def attempt(self) -> int:
        return int(self.payload.get("attempt", 0))

    @property
    def name(self) -> str:
        """The worker's name, for people (log lines of the agent)."""
        return str(self.payload.get("worker") or self.worker_id)

    @property
    def image(self) -> str | None:
        return self.payload.get("image") or None

    @property
    def run_folder(self) -> Path:
        return self.folder / RUN

    @property
    def progress_file(self) -> Path:
        return self.run_folder / PROGRESS

    def keep(self) -> None:
        """Write the start payload down: a worker at the barrier survives the agent too."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in (shim.EXIT, CONTAINER, LOGGED_AT):
            (self.folder / stale).unlink(missing_ok=True)
        shutil.rmtree(self.run_folder, ignore_errors=True)
        self.folder.chmod(0o711)
        self.run_folder.mkdir()
        # The container's user may be anyone (an image's own), unless the agent chose it
        # (start: then the folder becomes that user's alone).
        self.run_folder.chmod(0o777)
        shim.write_atomically(self.folder / PAYLOAD, json.dumps(self.payload), private=True)

    @classmethod
    def adopt(
        cls, folder: Path, log_root: Path, engine: Engine | None = None
    ) -> ContainerWorker | None:
        """The worker a previous agent left in this folder, or None when nothing is left.

        Its container is found again when it is waited for (``wait``), by the id written
        here or else by its labels; its log is copied on from where the last agent stopped.
        """
        try:
            payload = json.loads((folder / PAYLOAD).read_text())
        except (OSError, ValueError):
            shutil.rmtree(folder, ignore_errors=True)
            return None
        if not folder.name.isdigit():
            return None  # not a worker's folder (an agent before ids: left as it is)
        worker = cls(int(folder.name), payload, WorkerLog(log_root, folder.name), folder)
        if engine is not None:
            worker.engine = engine
        worker.container_id = _read_text(folder / CONTAINER)
        worker.started = worker.container_id is not None or (folder / shim.EXIT).exists()
        return worker

    def environment(self) -> dict[str, str]:
        return container_environment(self.payload, self.image_env, self.secrets)

    # --- before the barrier -------------------------------------------------------------

    async def prepare(self, report: PullReport | None = None) -> Exit | None:
        """Have the image on this machine: None when it is, else how the worker ended.

        While pulling, ``report`` is called with "Pulling image <image>" (the caller reports
        the worker Pulling with it), then every ten seconds with how far the download is. A
        failed pull is the worker's end, "ErrImagePull: <the engine's message>", also written
        down for a restarted agent. Run it in a task of its own: a pull takes minutes.
        """
        try:
            if self.image is None:
                raise EngineError(0, NO_IMAGE)
            found = await self.engine.image(self.image)
            if found is None:
                found = await self._pull(self.image, report)
        except (EngineError, httpx.TransportError) as error:
            failed = pull_failed(_said(error))
            shim.record_exit(self.folder, failed)
            return failed
        self.image_env = list((found.get("Config") or {}).get("Env") or [])
        return None

    async def _pull(self, image: str, report: PullReport | None) -> dict[str, Any]:
        progress = PullProgress(image)
        if report is not None:
            await report(progress.reason())
        pulling = asyncio.create_task(self.engine.pull(image, progress))
        try:
            while not pulling.done():
                await asyncio.wait({pulling}, timeout=PULL_REPORT_SECONDS)
                if report is not None and not pulling.done():
                    await report(progress.reason())
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
            self._not_started(_said(error), code)

    async def _create_and_start(self) -> None:
        for stale in await self.engine.containers(worker_filters(self.key)):
            await self.engine.remove(stale["Id"])  # an earlier attempt, or a half start
        credentials = self.payload.get("credentials") or []
        user = None
        try:
            identity = self.users.of_worker(self.payload)
        except (LookupError, ValueError) as error:
            raise EngineError(400, str(error.args[0])) from None
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
            self.payload,
            run_folder=self.run_folder,
            drives=self.drives or self.folder.parent.parent / "drives",
            image_env=self.image_env,
            secrets=self.secrets,
            user=user,
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
        metrics, self.cpu = stats_metrics(
            stats or {}, self.cpu, self.payload.get("memory_limit_bytes")
        )
        return metrics


def on_engine(socket: str = SOCKET) -> bool:
    """Whether a Docker engine's socket is on this machine."""
    return os.path.exists(socket)


def is_container_folder(folder: Path) -> bool:
    """Whether a worker's runtime folder was kept by a ContainerWorker (not a ProcessWorker),
    so a restarted agent takes each worker back with the executor that started it."""
    return (folder / RUN).is_dir()
