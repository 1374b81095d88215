"""Each worker in a control group of its own: memory, CPU and process limits, OOM kills seen as
such.

cgroup v2 where the machine has it (one unified hierarchy), v1 otherwise (the memory, cpu,
cpuacct and pids controllers). Groups live under ``astraeus/<install>/<worker id>``:
``install`` names the agent's data folder, so two agents (or two Astraeus installs) on one
machine never share a group, and the worker's id (never its name) tells workers apart. The
group's files belong to root: a workload, which never runs as root, cannot raise its own
limits. Without a writable hierarchy the worker runs without limits, and the agent says so once
in its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

ROOT = Path("/sys/fs/cgroup")
GROUP = "astraeus"
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's floor
MAX_CPU_WEIGHT = 10_000  # cgroup v2's ceiling for cpu.weight


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


class Measured(Protocol):
    """What a worker is measured by: its control group, or (a Slurm job's task without one)
    the set of its processes (agent/slurm_node.py). None: not known that way."""

    def pids(self) -> list[int]: ...

    def cpu_seconds(self) -> float | None: ...

    def memory_used(self) -> int | None: ...

    def memory_peak(self) -> int | None: ...

    def oom_kills(self) -> int | None: ...


@dataclass
class WorkerCgroup:
    """One worker's group, in v2 (``unified``) or in v1's memory and cpuacct controllers."""

    version: int
    memory: Path
    cpu: Path | None  # where CPU time is counted (v1: cpuacct)
    cpu_limit: Path | None = None  # where CPU time is limited (v1: cpu; v2: the group)
    pids_group: Path | None = None  # where its processes and threads are counted (v1: pids)

    def limit_memory(self, limit: int | None) -> None:
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        value = str(limit) if limit else ("max" if self.version == 2 else "-1")
        (self.memory / name).write_text(value)

    def limit_cpu(self, cores: float | None) -> bool:
        """At most ``cores`` cores of CPU time (CFS quota over a 100 ms period); False where
        this machine gives no CPU controller."""
        if self.cpu_limit is None:
            return False
        quota = max(MIN_CPU_QUOTA_US, round(cores * CPU_PERIOD_US)) if cores else None
        if self.version == 2:
            value = f"{quota} {CPU_PERIOD_US}" if quota else f"max {CPU_PERIOD_US}"
            (self.cpu_limit / "cpu.max").write_text(value)
        else:
            (self.cpu_limit / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (self.cpu_limit / "cpu.cfs_quota_us").write_text(str(quota or -1))
        return True

    def share_cpu(self, cores: float | None) -> bool:
        """Its share of CPU time where cores are contended, by the cores it reserved (v2
        ``cpu.weight``: 100 a core, as a sibling group has by default; v1 ``cpu.shares``: 1024 a
        core); None leaves the default. False where this machine gives no CPU controller."""
        if self.cpu_limit is None or not cores:
            return False
        if self.version == 2:
            weight = min(MAX_CPU_WEIGHT, max(1, round(cores * 100)))
            (self.cpu_limit / "cpu.weight").write_text(str(weight))
        else:
            (self.cpu_limit / "cpu.shares").write_text(str(max(2, round(cores * 1024))))
        return True

    def limit_pids(self, most: int | None) -> bool:
        """At most ``most`` processes and threads together (``pids.max``: a fork or a thread
        past it fails, EAGAIN); False where this machine gives no pids controller."""
        if self.pids_group is None or not (self.pids_group / "pids.max").exists():
            return False
        (self.pids_group / "pids.max").write_text(str(most) if most else "max")
        return True

    def pids_refused(self) -> int:
        """How many forks or threads the group's ``pids.max`` refused (``pids.events``)."""
        group = self.pids_group
        return _read_key(group / "pids.events", "max") if group is not None else 0

    def pids_limit(self) -> int | None:
        """The group's ``pids.max``; None where it has none."""
        group = self.pids_group
        return _read_int(group / "pids.max") if group is not None else None

    def folders(self) -> list[Path]:
        """The group's folders, one per hierarchy it is in."""
        out: list[Path] = []
        for folder in (self.memory, self.cpu, self.cpu_limit, self.pids_group):
            if folder is not None and all(folder.resolve() != f.resolve() for f in out):
                out.append(folder)
        return out

    def procs_files(self) -> list[Path]:
        return [folder / "cgroup.procs" for folder in self.folders()]

    def oom_kills(self) -> int:
        if self.version == 2:
            return _read_key(self.memory / "memory.events", "oom_kill")
        return _read_key(self.memory / "memory.oom_control", "oom_kill")

    def memory_used(self) -> int | None:
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return _read_int(self.memory / name)

    def memory_peak(self) -> int | None:
        """The most memory ever charged to the group (v2 ``memory.peak``, kernels from 5.19; v1
        ``memory.max_usage_in_bytes``); None where the kernel does not say."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return _read_int(self.memory / name)

    def cpu_seconds(self) -> float | None:
        if self.version == 2:
            usec = _read_key(self.memory / "cpu.stat", "usage_usec")
            return usec / 1e6
        if self.cpu is None:
            return None
        ns = _read_int(self.cpu / "cpuacct.usage")
        return ns / 1e9 if ns is not None else None

    def pids(self) -> list[int]:
        """The processes in the group and in the groups beneath it (Slurm puts a job's in a
        group per step and task, beneath the job's: agent/slurm_node.py)."""
        out: list[int] = []
        for folder, _, _ in os.walk(self.memory):
            with contextlib.suppress(OSError, ValueError):
                out += [int(p) for p in (Path(folder) / "cgroup.procs").read_text().split()]
        return out

    def kill_all(self, rounds: int = 20) -> None:
        """SIGKILL every process in the group, also those that left the worker's process group
        (a daemon, setsid); again while any forked meanwhile."""
        kill_file = self.memory / "cgroup.kill"
        for _ in range(rounds):
            pids = self.pids()
            if not pids:
                return
            if self.version == 2 and kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        for folder in self.folders():
            with contextlib.suppress(OSError):
                folder.rmdir()


def _v1_group(root: Path, controller: str, install: str, key: str) -> Path | None:
    """The worker's folder in one v1 controller, made; None where the agent may not."""
    if not _writable(root / controller):
        return None
    folder = root / controller / GROUP / install / key
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


def available(root: Path = ROOT) -> bool:
    """Whether this machine gives the agent control groups to put workers in (v2's unified
    hierarchy, or v1's memory controller, writable): without, no worker's CPU, memory or OOM
    kills are measured."""
    if (root / "cgroup.controllers").exists():
        return _writable(root)
    return _writable(root / "memory")


def pids_available(root: Path = ROOT) -> bool:
    """Whether the agent may limit its workers' processes: v2's pids controller, or v1's pids
    hierarchy, writable."""
    if (root / "cgroup.controllers").exists():
        with contextlib.suppress(OSError):
            return _writable(root) and "pids" in (root / "cgroup.controllers").read_text().split()
        return False
    return _writable(root / "pids")


def create(key: str, install: str, root: Path = ROOT) -> WorkerCgroup | None:
    """A fresh group for the worker known here as ``key``, under the install's own root; None
    where this machine gives the agent none."""
    if (root / "cgroup.controllers").exists() and _writable(root):
        folder = root / GROUP / install / key
        with contextlib.suppress(OSError):
            for parent in (root / GROUP, root / GROUP / install):
                parent.mkdir(exist_ok=True)
                for controller in ("+memory", "+cpu", "+pids"):  # each where it is given
                    with contextlib.suppress(OSError):
                        (parent / "cgroup.subtree_control").write_text(controller)
            folder.mkdir(exist_ok=True)
            cpu_limit = folder if (folder / "cpu.max").exists() else None
            pids = folder if (folder / "pids.max").exists() else None
            return WorkerCgroup(2, folder, folder, cpu_limit, pids)
        return None
    memory = _v1_group(root, "memory", install, key)
    if memory is None:
        return None
    cpuacct = _v1_group(root, "cpuacct", install, key)
    cpu = _v1_group(root, "cpu", install, key)
    return WorkerCgroup(1, memory, cpuacct, cpu, _v1_group(root, "pids", install, key))
