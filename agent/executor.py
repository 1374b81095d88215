"""The process executor: each worker a process group of its own on this machine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from agent import cgroups
from agent.logs import WorkerLog

STOP_GRACE_SECONDS = 10.0
OOM_KILLED = "OOMKilled: the container exceeded its memory limit"


def exited_with(code: int) -> str:
    return f"Exited with code {code}"


@dataclass
class Exit:
    code: int | None
    reason: str


@dataclass
class ProcessWorker:
    """One worker: its start payload, its log, and its process once released."""

    name: str
    payload: dict[str, Any]
    log: WorkerLog
    process: asyncio.subprocess.Process | None = None
    pump: asyncio.Task[None] | None = None
    stopping: bool = False
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    cgroup: cgroups.WorkerCgroup | None = None

    @property
    def attempt(self) -> int:
        return int(self.payload.get("attempt", 0))

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")}
        env.update(self.payload.get("environment") or {})
        env.update(self.payload.get("astraeus_environment") or {})
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def run(self) -> Exit:
        """Start the process, copy its output to the log, and wait for it to end."""
        command = self.payload.get("command") or []
        self.log.begin()
        if not command:
            return Exit(127, exited_with(127))
        self.cgroup = cgroups.create(self.name)
        argv = list(command)
        if self.cgroup is not None:
            self.cgroup.limit_memory(self.payload.get("memory_limit_bytes"))
            # The process enters its group itself, before its command runs (a shell that
            # joins, then execs): nothing it allocates escapes the limit. Python's preexec_fn
            # would do the same but is unsafe in a process with threads.
            argv = [*cgroups.join_then_exec(self.cgroup), *command]
        kills_before = self.cgroup.oom_kills() if self.cgroup else 0
        try:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as error:
            self.log.append(f"{command[0]}: {error.strerror}\n".encode())
            return Exit(
                127 if isinstance(error, FileNotFoundError) else 126,
                exited_with(127 if isinstance(error, FileNotFoundError) else 126),
            )
        self.pump = asyncio.create_task(self._copy_output())
        code = await self.process.wait()
        await self.pump
        if code < 0:
            code = 128 - code  # killed by a signal: the shell's convention
        if self.cgroup is not None and self.cgroup.oom_kills() > kills_before:
            return Exit(137, OOM_KILLED)
        return Exit(code, exited_with(code))

    def release(self) -> None:
        """The process is gone: its group goes too."""
        if self.cgroup is not None:
            self.cgroup.remove()

    async def _copy_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while chunk := await self.process.stdout.read(65536):
            self.log.append(chunk)

    async def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after the grace period."""
        self.stopping = True
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
