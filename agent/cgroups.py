"""Each worker in a control group of its own: a memory limit, and OOM kills seen as such.

cgroup v2 where the machine has it (one unified hierarchy), v1 otherwise (the memory and
cpuacct controllers). Without a writable hierarchy the worker runs without a limit, and the
agent says so once in its log.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "astraeus"


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def _read_key(path: Path, key: str) -> int:
    """A counter from a flat keyed file such as memory.events or memory.oom_control."""
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


@dataclass
class WorkerCgroup:
    """One worker's group, in v2 (``unified``) or in v1's memory and cpuacct controllers."""

    version: int
    memory: Path
    cpu: Path | None

    def limit_memory(self, limit: int | None) -> None:
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        value = str(limit) if limit else ("max" if self.version == 2 else "-1")
        (self.memory / name).write_text(value)

    def procs_files(self) -> list[Path]:
        files = [self.memory / "cgroup.procs"]
        if self.cpu is not None and self.cpu != self.memory:
            files.append(self.cpu / "cgroup.procs")
        return files

    def oom_kills(self) -> int:
        if self.version == 2:
            return _read_key(self.memory / "memory.events", "oom_kill")
        return _read_key(self.memory / "memory.oom_control", "oom_kill")

    def memory_used(self) -> int | None:
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return _read_int(self.memory / name)

    def cpu_seconds(self) -> float | None:
        if self.version == 2:
            usec = _read_key(self.memory / "cpu.stat", "usage_usec")
            return usec / 1e6
        if self.cpu is None:
            return None
        ns = _read_int(self.cpu / "cpuacct.usage")
        return ns / 1e9 if ns is not None else None

    def remove(self) -> None:
        for folder in {self.memory, self.cpu} - {None}:
            with contextlib.suppress(OSError):
                folder.rmdir()  # type: ignore[union-attr]


def create(worker: str, root: Path = ROOT) -> WorkerCgroup | None:
    """A fresh group for the worker, or None where this machine gives the agent none."""
    if (root / "cgroup.controllers").exists() and _writable(root):
        folder = root / GROUP / worker
        with contextlib.suppress(OSError):
            (root / GROUP).mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                (root / GROUP / "cgroup.subtree_control").write_text("+memory +cpu")
            folder.mkdir(exist_ok=True)
            return WorkerCgroup(2, folder, folder)
        return None
    memory_root = root / "memory"
    if not _writable(memory_root):
        return None
    try:
        memory = memory_root / GROUP / worker
        memory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    cpu = None
    cpuacct_root = root / "cpuacct"
    if _writable(cpuacct_root):
        with contextlib.suppress(OSError):
            cpu = cpuacct_root / GROUP / worker
            cpu.mkdir(parents=True, exist_ok=True)
    return WorkerCgroup(1, memory, cpu)


JOIN_THEN_EXEC = 'echo $$ > "$1" && { [ -z "$2" ] || echo $$ > "$2"; } && shift 2 && exec "$@"'


def join_then_exec(group: WorkerCgroup) -> list[str]:
    """The start of an argv that puts its own process in the group, then becomes the command."""
    files = [str(f) for f in group.procs_files()] + [""]
    return ["/bin/sh", "-c", JOIN_THEN_EXEC, "astraeus-worker", files[0], files[1]]
