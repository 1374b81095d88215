"""The Docker executor's translations, as pure functions tested without an engine: the engine's
API version, image references and pull progress, container states to ends, the multiplexed log
frames and their timestamps, stats to metrics, the create body from a worker's start, the
containers a restarted agent no longer keeps. The container's layout (labels, folders) is here
too: the worker (agent/docker.py) and the Engine client (agent/engine.py) share it."""

from __future__ import annotations

import json
import posixpath
import struct
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from agent import prepare
from agent.executor import OOM_KILLED, SDK, EndCause, Exit
from agent.shim import KILLED
from agent.start import StartSpec

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


class EngineError(Exception):
    """The engine answered with an error: its status and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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

    def done(self) -> str:
        """How far the download is ("2.1 GB of 3.4 GB"), once the engine says; "" before."""
        size = sum(total for _, total in self.layers.values())
        if not size:
            return ""
        done = sum(current for current, _ in self.layers.values())
        return f"{_size(done)} of {_size(size)}"


def exit_of(state: dict[str, Any]) -> Exit | None:
    """How a container ended, from its inspected ``State``; None when it never started.

    The engine's OOMKilled says that a process of the container was killed for memory, not
    which: its command's end is the container's (its init passes it on: 137 when the kernel
    killed it), so only a container that ended 137 with OOMKilled was killed for memory; a
    child killed while the command went on ends nothing, and is counted (``oom_kill_seen``).
    One whose start failed stays "created" with the engine's code (127 command not found, 126
    not executable, 128 otherwise) and the error beside it.
    """
    code = int(state.get("ExitCode") or 0)
    seen = bool(state.get("OOMKilled"))
    if seen and code == KILLED:
        return Exit(KILLED, OOM_KILLED, oom_kill_seen=True)
    if state.get("Status") == "created" and code == 0:
        return None
    return Exit(code, EndCause.EXITED, oom_kill_seen=seen)


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
    spec: StartSpec,
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
    env.update(spec.environment)
    env.update(
        prepare.credential_variables(spec.credentials, secrets or {}, f"{CONTAINER_RUN}/{SECRETS}")
    )
    env.update(spec.astraeus_environment)
    gpus = spec.gpu_ids
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


def container_path(path: str) -> str:
    """Where a mount's path is in the container: a relative one under the worker's own folder
    there (as a process's is under its own), an absolute one as it is."""
    return path if path.startswith("/") else posixpath.normpath(f"{CONTAINER_RUN}/{path}")


def create_body(
    worker: str,
    spec: StartSpec,
    *,
    run_folder: Path,
    drives: Path,
    image_env: Iterable[str] | None = None,
    sdk: Path = SDK,
    secrets: dict[str, str] | None = None,
    user: str | None = None,
    pids_limit: int = 0,
) -> dict[str, Any]:
    """``POST /containers/create``'s body for a worker's start. ``user`` (uid:gid) is
    who it runs as where the agent chose (agent/identity.py); else the spec's, or the image's.
    Setuid programs in the image give it nothing (no-new-privileges). Its processes and threads
    are at most ``pids_limit`` (0: no limit), as a process worker's (agent/sandbox.py); its /tmp
    is its own file system's, its IPC and pid namespaces its own (``IpcMode`` said, not left to
    the daemon's default)."""
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
        "IpcMode": "private",
    }
    if pids_limit:
        host["PidsLimit"] = pids_limit
    for mount in spec.mounts:
        bind = f"{drives / mount.drive}:{container_path(mount.path)}"
        host["Binds"].append(bind + (":ro" if mount.read_only else ""))
    memory = spec.memory_limit_bytes
    if memory:
        host["Memory"] = memory
        host["MemorySwap"] = memory  # the limit is the limit: no swap beyond it
    if spec.cpu:
        host["NanoCpus"] = round(spec.cpu * 1e9)
    if spec.cpu_request:  # its share where cores are contended: 1024 a core
        host["CpuShares"] = max(2, round(spec.cpu_request * 1024))
    gpus = spec.gpu_ids
    if gpus:
        host["DeviceRequests"] = [
            {"Driver": "nvidia", "DeviceIDs": [str(g) for g in gpus], "Capabilities": [["gpu"]]}
        ]
    env = container_environment(spec, image_env, secrets)
    body: dict[str, Any] = {
        "Image": spec.image,
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Labels": {LABEL_WORKER: worker, LABEL_ATTEMPT: str(spec.attempt)},
        "Tty": False,
        "OpenStdin": False,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "HostConfig": host,
    }
    if spec.command:
        body["Cmd"] = list(spec.command)
    if user or spec.user:
        body["User"] = user or spec.user
    if spec.working_dir:
        body["WorkingDir"] = spec.working_dir
    elif spec.code:  # its run's code, unpacked in its run folder (agent/code.py)
        body["WorkingDir"] = f"{CONTAINER_RUN}/code"
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
