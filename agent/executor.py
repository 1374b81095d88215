"""The process executor: each worker a process group of its own on this machine, kept by a shim.

A worker's runtime folder (``<data>/workers/<worker>/``) holds what a restarted agent needs to
take it back: the start payload, the shim's pid, the worker's process group, its progress
file, and how it ended. The log lives apart (``<data>/logs/<worker>/``) and outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import cgroups, prepare, shim
from agent.logs import WorkerLog

STOP_GRACE_SECONDS = 10.0
ADOPTED_POLL_SECONDS = 1.0
PAYLOAD = "payload.json"
SHIM_PID = "shim.pid"
PROGRESS = "progress"
SDK = Path(__file__).parent / "sdk"
LOST = "Lost: its process ended while the agent was away"
OOM_KILLED = shim.OOM_KILLED
exited_with = shim.exited_with


@dataclass
class Exit:
    code: int | None
    reason: str


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def _is_shim(pid: int) -> bool:
    """The process is alive and is a shim (a recycled pid is not)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    zombie = status.rpartition(")")[2].split()[0] == "Z"
    return not zombie and b"agent.shim" in cmdline


@dataclass
class ProcessWorker:
    """One worker: its start payload, its log, and its shim once released."""

    name: str
    payload: dict[str, Any]
    log: WorkerLog
    folder: Path
    started: bool = False
    stopping: bool = False
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    cgroup: cgroups.WorkerCgroup | None = None
    shim_process: asyncio.subprocess.Process | None = None
    # Credentials' values, in memory only (never in payload.json); given at start.
    secrets: dict[str, str] = field(default_factory=dict)
    drive_root: Path | None = None

    @property
    def attempt(self) -> int:
        return int(self.payload.get("attempt", 0))

    @property
    def progress_file(self) -> Path:
        return self.folder / PROGRESS

    def keep(self) -> None:
        """Write the start payload down: a worker at the barrier survives the agent too."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in (shim.EXIT, shim.WORKER_PID, SHIM_PID, PROGRESS):
            (self.folder / stale).unlink(missing_ok=True)
        shim.write_atomically(self.folder / PAYLOAD, json.dumps(self.payload))

    @classmethod
    def adopt(cls, folder: Path, log_root: Path) -> ProcessWorker | None:
        """The worker a previous agent left in this folder, or None when nothing is left."""
        try:
            payload = json.loads((folder / PAYLOAD).read_text())
        except (OSError, ValueError):
            shutil.rmtree(folder, ignore_errors=True)
            return None
        worker = cls(folder.name, payload, WorkerLog(log_root, folder.name), folder)
        worker.started = (folder / SHIM_PID).exists()
        spec = folder / shim.SPEC
        if spec.exists():
            with contextlib.suppress(OSError, ValueError):
                worker.cgroup = shim.cgroup_of(json.loads(spec.read_text()))
        return worker

    @property
    def secrets_folder(self) -> Path:
        return self.folder / "secrets"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")}
        env.update(self.payload.get("environment") or {})
        credentials = self.payload.get("credentials") or []
        env.update(
            prepare.credential_variables(credentials, self.secrets, str(self.secrets_folder))
        )
        if self.drive_root is not None:
            env.update(prepare.expose_drives(self.payload, self.drive_root))
        env.update(self.payload.get("astraeus_environment") or {})
        env["ASTRAEUS_PROGRESS_FILE"] = str(self.progress_file)
        # `import astraeus_progress` works in the worker; its own PYTHONPATH comes first.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(SDK)) if p)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def start(self) -> None:
        """Start the shim, which starts the command; the log begins anew."""
        command = list(self.payload.get("command") or [])
        self.log.begin()
        self.started = True
        credentials = self.payload.get("credentials") or []
        prepare.write_secret_files(credentials, self.secrets, self.secrets_folder)
        if not command:
            shim.record_exit(self.folder, 127, exited_with(127))
            return
        self.cgroup = cgroups.create(self.name)
        argv = command
        group = None
        if self.cgroup is not None:
            self.cgroup.limit_memory(self.payload.get("memory_limit_bytes"))
            # The process enters its group itself, before its command runs (a shell that
            # joins, then execs): nothing it allocates escapes the limit.
            argv = [*cgroups.join_then_exec(self.cgroup), *command]
            group = {
                "version": self.cgroup.version,
                "memory": str(self.cgroup.memory),
                "cpu": str(self.cgroup.cpu) if self.cgroup.cpu else None,
            }
        spec = {
            "worker": self.name,
            "argv": argv,
            "env": self.environment(),
            "cwd": self.payload.get("working_dir"),
            "log_root": str(self.log.folder.parent),
            "cgroup": group,
        }
        # The spec holds the credentials' values: readable by the agent's user only.
        shim.write_atomically(self.folder / shim.SPEC, json.dumps(spec), private=True)
        self.shim_process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent.shim",
            str(self.folder),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        shim.write_atomically(self.folder / SHIM_PID, str(self.shim_process.pid))

    def ended(self) -> Exit | None:
        """How the worker ended, once its shim has written it down."""
        recorded = shim.recorded_exit(self.folder)
        return Exit(*recorded) if recorded is not None else None

    def alive(self) -> bool:
        pid = _read_int(self.folder / SHIM_PID)
        return pid is not None and _is_shim(pid)

    async def wait(self) -> Exit:
        """Wait for the end the shim records.

        A shim this agent started is its child: its exit wakes us, no polling. A shim of an
        earlier agent is not; it is looked at every ``ADOPTED_POLL_SECONDS`` (the cost of
        sampling stays under 1% of a core with 8 workers: bench/agent_cpu.py)."""
        if self.shim_process is not None:
            await self.shim_process.wait()
            return self.ended() or Exit(None, LOST)
        while True:
            ended = self.ended()
            if ended is not None:
                return ended
            if not self.alive():
                return self.ended() or Exit(None, LOST)
            await asyncio.sleep(ADOPTED_POLL_SECONDS)

    def process_group(self) -> int | None:
        return _read_int(self.folder / shim.WORKER_PID)

    async def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after the grace period."""
        self.stopping = True
        group = self.process_group()
        if group is None or self.ended() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.wait(), STOP_GRACE_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wait(), STOP_GRACE_SECONDS)

    def release(self) -> None:
        """The worker is gone and reported: its group and runtime folder go too."""
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.folder, ignore_errors=True)


def end_left_workers(data_dir: Path) -> None:
    """Kill every worker (and its shim) an agent left running in ``data_dir``: workers outlive
    their agent by design, so taking a machine out of service (or a test) ends them here."""
    for pid_file in data_dir.glob(f"workers/*/{shim.WORKER_PID}"):
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    for pid_file in data_dir.glob(f"workers/*/{SHIM_PID}"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            if _is_shim(pid):
                os.kill(pid, signal.SIGKILL)
