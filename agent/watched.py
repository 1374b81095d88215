"""A worker that Slurm runs on this node and the agent watches (``astraeus agent --executor
slurm``): what the server said of it (a WATCH: its job, its task, its GPUs, where its log and
progress file are), what the agent found of it on the node (its processes, their group), and
the agent's copy of its log. The sampler reads it as it reads the agent's own workers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from astraeus.agent.v1 import agent_pb2

from agent import confined
from agent.cgroups import Measured
from agent.log_copy import LogCopy
from agent.logs import WorkerLog


@dataclass(frozen=True)
class Watch:
    """A WATCH command's content (see the proto's WatchWorker)."""

    worker: str
    attempt: int
    job_id: str
    task: int | None
    gpu_ids: tuple[int, ...]
    state_dir: str
    run_folder: str
    log: str
    progress: str
    batch_output: bool

    @classmethod
    def of(cls, message: agent_pb2.WatchWorker) -> Watch:
        return cls(
            worker=message.worker,
            attempt=message.attempt,
            job_id=message.slurm_job_id,
            task=message.task if message.HasField("task") else None,
            gpu_ids=tuple(message.gpu_ids),
            state_dir=message.state_dir,
            run_folder=message.run_folder,
            log=message.log,
            progress=message.progress,
            batch_output=message.batch_output,
        )


@dataclass
class WatchedWorker:
    worker_id: int
    watch: Watch
    log: WorkerLog  # the agent's copy, in its own log folder
    started: bool = False  # its processes were seen
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    # Slurm ended it here: the server said so (a STOP), or its processes are gone.
    ended_here: asyncio.Event = field(default_factory=asyncio.Event)
    snapshot_asked: bool = False  # the server said so: its last lines go to it at the end
    cgroup: Measured | None = None
    copy: LogCopy | None = None
    run_fd: int | None = None  # its run's folder, opened beneath the state folder
    since: float = field(default_factory=time.monotonic)
    memory_limit_bytes: int | None = None

    @property
    def attempt(self) -> int:
        return self.watch.attempt

    @property
    def name(self) -> str:
        return self.watch.worker or str(self.worker_id)

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return self.watch.gpu_ids

    @property
    def progress_file(self) -> Path | None:
        """The task's progress file, through the run's folder as it was opened (a link put in
        the folder's place since leads nowhere); None for a job Astraeus did not submit."""
        if self.run_fd is None or not self.watch.progress:
            return None
        return Path(f"/proc/self/fd/{self.run_fd}") / self.watch.progress

    def open_run_folder(self) -> None:
        """The run's folder beneath the state folder, no part of it a link (agent/confined.py),
        and the copy of the task's log from it. Tried again at each look until it is there."""
        w = self.watch
        if self.run_fd is not None or not (w.state_dir and w.run_folder and w.log):
            return
        with contextlib.suppress(OSError, ValueError):
            self.run_fd = confined.open_folder(Path(w.state_dir), w.run_folder)
            folder = self.run_fd
            self.copy = LogCopy(
                self.log,
                lambda: confined.open_file(folder, f"{w.log}/current.log"),
                lambda: confined.open_file(folder, f"{w.log}/current.times"),
            )

    def copy_batch_output(self, pid: int) -> None:
        """The job's output, as its batch script's standard output: the file Slurm opened for
        it as the job's user, reopened through the process just listed as the job's (no path
        the user names is read; a process id is never tried again once it may be another's)."""
        if self.copy is not None:
            return
        with contextlib.suppress(OSError):
            opened = [_standard_output(pid)]

            def once() -> int:  # (a closed descriptor's number may be another file's later)
                if not opened:
                    raise OSError(f"the output of process {pid} was closed")
                return opened.pop()

            self.copy = LogCopy(self.log, once)

    def close(self) -> None:
        if self.copy is not None:
            self.copy.close()
        confined.close(self.run_fd)
        self.run_fd = None


def _standard_output(pid: int) -> int:
    fd = os.open(f"/proc/{pid}/fd/1", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe, a terminal: nothing to copy from
        os.close(fd)
        raise OSError(f"process {pid}'s output is not a file")
    return fd
