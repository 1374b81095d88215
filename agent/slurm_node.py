"""Slurm on this node, as a Slurm node's agent reads it (``astraeus agent --executor slurm``):
which processes are a job's (``scontrol listpids``, from the job's slurmstepd: what a job
says of itself in its environment is not asked), and the control group Slurm put them in,
which is the worker's measure (its CPU time, memory, limit and OOM kills).

With Slurm's cgroup plugins (proctrack/cgroup, task/cgroup) a job's processes on a node are in
``…/job_<id>/step_<step>/task_<n>`` (v1: in each controller's hierarchy; v2: one): a task's own
group is a submitted run's worker, the job's group an imported job's part on this node. Without
them (proctrack/linuxproc) the processes stay in slurmd's group, which is no job's: the worker
is then measured as the set of its processes (``ProcessSet``), summed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent import cgroups
from agent.cgroups import WorkerCgroup

LISTPIDS_TIMEOUT_S = 10.0
BATCH = "batch"  # the step that runs the batch script (its output is the job's)


@dataclass(frozen=True)
class TaskPid:
    """One process of a job on this node, as ``scontrol listpids`` prints it."""

    pid: int
    job_id: str
    step: str  # "0", "1", … "batch", "extern"
    task: int | None  # the task's global rank (SLURM_PROCID); None: the step's own helpers


def parse_listpids(text: str) -> list[TaskPid]:
    """``scontrol listpids``'s table (``PID JOBID STEPID LOCALID GLOBALID``, "-" for none)."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[0].isdigit():
            continue  # the header, or a line of another shape
        pid, job, step, _, task = fields[:5]
        out.append(TaskPid(int(pid), job, step, int(task) if task.isdigit() else None))
    return out


class SlurmNode:
    """This node's Slurm, through its commands (``bin``: their folder; ``conf``: slurm.conf),
    as the node ``name`` (Slurm's name for it: the host's, unless slurmd was started as
    another)."""

    def __init__(self, name: str, conf: str | None = None, bin: str | None = None) -> None:
        self.name = name
        self.conf = conf
        self.bin = bin

    def _env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
        if self.conf:
            env["SLURM_CONF"] = self.conf
        return env

    async def processes(self) -> list[TaskPid] | None:
        """Every process of every job on this node (one call for them all); None when Slurm
        does not answer (slurmd away: the watches look again next time)."""
        program = str(Path(self.bin) / "scontrol") if self.bin else "scontrol"
        try:
            process = await asyncio.create_subprocess_exec(
                program,
                "listpids",
                "*",  # every job
                self.name,
                env=self._env(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError:
            return None
        try:
            out, _ = await asyncio.wait_for(process.communicate(), LISTPIDS_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            return None
        # With no job on the node it says so on stderr and exits 1: nothing runs here.
        return parse_listpids(out.decode(errors="replace"))


def of_worker(found: Iterable[TaskPid], job_id: str, task: int | None) -> list[TaskPid]:
    """A worker's processes: its task's in the job's steps (a submitted run's worker), or all
    of the job's on this node (``task`` None: an imported job's part here)."""
    return [
        p
        for p in found
        if p.job_id == job_id and (task is None or (p.task == task and p.step != BATCH))
    ]


def batch_process(found: Iterable[TaskPid], job_id: str) -> int | None:
    """The batch script's process of the job (its stdout is the job's output), if here."""
    pids = sorted(p.pid for p in found if p.job_id == job_id and p.step == BATCH)
    return pids[0] if pids else None


def _cgroup_paths(pid: int, proc: Path) -> dict[str, str]:
    """The process's group in each hierarchy: v1 controllers by name, v2's as ""."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in (proc / str(pid) / "cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                out[controller] = path
    return out


def _within_job(path: str, job_id: str, whole_job: bool) -> str | None:
    """The group to measure: the job's (cut after ``job_<id>``) or the path as it is, when it
    is inside the job's group; None when it is not a group of the job's at all."""
    parts = path.strip("/").split("/")
    marker = f"job_{job_id}"
    if marker not in parts:
        return None
    if whole_job:
        parts = parts[: parts.index(marker) + 1]
    return "/" + "/".join(parts)


def job_group(
    pid: int,
    job_id: str,
    *,
    whole_job: bool,
    root: Path = cgroups.ROOT,
    proc: Path = Path("/proc"),
) -> WorkerCgroup | None:
    """The group Slurm put the process in (or its job's, ``whole_job``), when it is one of
    the job's: v2's unified group, or v1's memory and cpuacct groups."""
    paths = _cgroup_paths(pid, proc)
    if (root / "cgroup.controllers").exists() and "" in paths:
        found = _within_job(paths[""], job_id, whole_job)
        if found is None:
            return None
        folder = root / found.lstrip("/")
        return WorkerCgroup(2, folder, folder) if folder.is_dir() else None
    memory = _within_job(paths.get("memory", ""), job_id, whole_job)
    if memory is None or not (root / "memory" / memory.lstrip("/")).is_dir():
        return None
    cpu = _within_job(paths.get("cpuacct", ""), job_id, whole_job)
    cpu_folder = root / "cpuacct" / cpu.lstrip("/") if cpu is not None else None
    return WorkerCgroup(
        1,
        root / "memory" / memory.lstrip("/"),
        cpu_folder if cpu_folder is not None and cpu_folder.is_dir() else None,
    )


def memory_limit(group: WorkerCgroup, machine_memory: int) -> int | None:
    """The memory the worker is held to: the least limit of its group and those above it up to
    its job's (Slurm sets --mem on the job's and step's groups; a task's tasks share them).
    None where none is set (v2 "max"; v1 a figure near 2**63, or the machine's memory)."""
    name = "memory.max" if group.version == 2 else "memory.limit_in_bytes"
    limits = []
    folder = group.memory
    while True:
        with contextlib.suppress(OSError, ValueError):
            text = (folder / name).read_text().strip()
            if text != "max" and 0 < int(text) < machine_memory:
                limits.append(int(text))
        if folder.name.startswith("job_") or folder.parent == folder:
            break
        folder = folder.parent
    return min(limits) if limits else None


_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class ProcessSet:
    """A worker measured as its processes, where Slurm gives it no group of its own: their CPU
    time (with that of their children that ended: a process's own and its reaped children's)
    and resident memory, summed. Limits and OOM kills are not known this way (None)."""

    processes: Sequence[int]
    proc: Path = Path("/proc")

    def pids(self) -> list[int]:
        return [p for p in self.processes if (self.proc / str(p)).exists()]

    def cpu_seconds(self) -> float | None:
        ticks, found = 0, False
        for pid in self.processes:
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (self.proc / str(pid) / "stat").read_text().rpartition(")")[2].split()
                # after ")": state is field 3, so utime, stime, cutime, cstime are 14..17
                ticks += sum(int(f) for f in fields[11:15])
                found = True
        return ticks / _TICKS if found else None

    def memory_used(self) -> int | None:
        total, found = 0, False
        for pid in self.processes:
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int((self.proc / str(pid) / "statm").read_text().split()[1]) * _PAGE
                found = True
        return total if found else None

    def memory_peak(self) -> int | None:
        return None

    def oom_kills(self) -> int | None:
        return None
