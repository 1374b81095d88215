"""The process executor: each worker a process group of its own on this machine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from agent.logs import WorkerLog

STOP_GRACE_SECONDS = 10.0


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
        try:
            self.process = await asyncio.create_subprocess_exec(
                *command,
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
        return Exit(code, exited_with(code))

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
