"""Every few seconds, each worker's samples, its progress, and whether it printed anything.

From the worker's control group: ``task_cpu_usage_cores`` (the CPU time used since the last
look over the wall time), ``task_memory_used_bytes``, ``task_memory_limit_bytes`` and
``task_oom_kills_total``. Besides the looks every few seconds, a worker is sampled as it starts
(once its process is in its group) and as it ends (its group read once more: the kill of its
main process empties the group, and no look sees it running again), so a worker that lived
seconds, killed for memory say, still has a curve from its start to its end (seed L-52).

Network bytes are not sampled by the process executor: its workers share the machine's
network, so there is no per-worker count; the agent says so in its Hello (``unmeasured``), and
the API and console say "Not measured" rather than showing nothing or 0. Per GPU of the worker,
NVML's readings; simulated GPUs are as busy as the workload says or shows (see
``simulated_utilization``), and their memory follows the worker's own (see
``simulated_memory``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from astraeus.agent.v1 import agent_pb2

from agent import cgroups
from agent.cgroups import Measured
from agent.gpus import NvmlSampler, simulated_memory_used
from agent.logs import WorkerLog


class SampledWorker(Protocol):
    """What the sampler reads of a worker, whichever executor runs it."""

    worker_id: int
    log: WorkerLog
    started: bool
    exited: asyncio.Event

    @property
    def gpu_ids(self) -> Sequence[int]: ...

    @property
    def memory_limit_bytes(self) -> int | None: ...

    @property
    def cgroup(self) -> Measured | None: ...

    @property
    def attempt(self) -> int: ...

    @property
    def progress_file(self) -> Path | None: ...


NETWORK_METRICS = ("task_network_receive_bytes_total", "task_network_transmit_bytes_total")
CGROUP_METRICS = ("task_cpu_usage_cores", "task_memory_used_bytes", "task_oom_kills_total")


def unmeasured(executor: str, cgroups_available: bool | None = None) -> list[str]:
    """The metrics this agent cannot attribute to one worker (Hello.unmeasured_metrics).

    Network bytes, with either executor: processes share the host's network, and containers
    run on it too (``NetworkMode: host``, so that gangs reach rank 0 at the machine's address),
    so the engine gives no per-container count. CPU, memory and OOM kills of processes where
    the machine gives the agent no control groups (a container's come from its engine)."""
    out = list(NETWORK_METRICS)
    if executor == "slurm":
        return out  # Slurm's groups of its jobs, else their processes (agent/slurm_node.py)
    if cgroups_available is None:
        cgroups_available = cgroups.available()
    if executor != "docker" and not cgroups_available:
        out += CGROUP_METRICS
    return out


# A simulated GPU's memory where the agent was not told it (gpus.simulated's default).
SIMULATED_MEMORY_BYTES = 80 * 2**30

# A simulated GPU is busy while its workload's step moved within this long.
BUSY_WINDOW_S = 30.0
SIMULATED_BUSY = 0.95


@dataclass(frozen=True)
class ProgressReport:
    step: int
    loss: float | None = None
    checkpoint_step: int | None = None
    # The workload's own GPU figure (0 to 1) for simulated GPUs: one for all, or one per GPU in
    # the order of the worker's GPUs.
    gpu_utilization: float | tuple[float, ...] | None = None

    def utilization_of(self, position: int) -> float | None:
        figure = self.gpu_utilization
        if isinstance(figure, tuple):
            return figure[position] if position < len(figure) else None
        return figure


def _utilization(value: Any) -> float | tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return tuple(float(v) for v in value)
    return float(value)


# The progress file is read from its end, at most this much: a workload that appends a line a
# step for days keeps a file of megabytes; its last line is all that counts.
PROGRESS_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class ProgressRead:
    """One read of the progress file: its last report, and whether more may still be coming
    (a last line without its newline yet, or one that does not parse: look again next time)."""

    report: ProgressReport | None
    settled: bool


def _read_tail(path: Path) -> tuple[bytes, bool] | None:
    """The file's last bytes (at most ``PROGRESS_TAIL_BYTES``) and whether they are all of it,
    as root reads a file its workload owns: never through a link (it could point at any file
    of the machine), never a FIFO that blocks, never all of a file the workload made huge."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        size = os.lseek(fd, 0, os.SEEK_END)
        start = max(size - PROGRESS_TAIL_BYTES, 0)
        return os.pread(fd, size - start, start), start == 0
    except OSError:
        return None
    finally:
        os.close(fd)


# A step the server can keep: 0 to the largest 64-bit signed integer (its columns' range).
MAX_STEP = 2**63 - 1


def _step(value: Any) -> int:
    """A step of a report; ValueError for one out of range (negative, or past MAX_STEP): a
    workload writes its file, and no number of its may stop the agent or the server."""
    step = int(value)
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"step out of range: {step}")
    return step


def parse_progress(text: str) -> ProgressReport | None:
    """One report: a bare step number, or a JSON object with ``step`` (the SDK's); a step or
    checkpoint out of range makes it not a report."""
    text = text.strip()
    if not text:
        return None
    with contextlib.suppress(ValueError):
        return ProgressReport(step=_step(text))
    try:
        data = json.loads(text)
        return ProgressReport(
            step=_step(data["step"]),
            loss=float(data["loss"]) if data.get("loss") is not None else None,
            checkpoint_step=(
                _step(data["checkpoint_step"]) if data.get("checkpoint_step") is not None else None
            ),
            gpu_utilization=_utilization(data.get("gpu_utilization")),
        )
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return None  # half written, or not ours


def read_progress_file(path: Path) -> ProgressRead:
    """The workload's last report, whether it overwrites the file (``echo 120 >``, the SDK) or
    appends a line a step (``0\\n10\\n20\\n``).

    A file whose whole content is one report counts as it is, newline or not (``echo -n 120 >``,
    a pretty-printed JSON object). Otherwise only complete lines count: the last one that
    parses; a last line without its newline is still being written and waits for the next
    look (the last complete line before it counts meanwhile)."""
    read = _read_tail(path)
    if read is None:
        return ProgressRead(None, settled=False)
    data, whole = read
    text = data.decode(errors="replace")
    if whole:
        alone = parse_progress(text)
        if alone is not None:
            return ProgressRead(alone, settled=True)
    lines = text.split("\n")
    partial = lines.pop()  # after the last newline: empty when the file ends with one
    if not whole and lines:
        lines.pop(0)  # the part of a line that began before what was read
    for line in reversed(lines):
        report = parse_progress(line)
        if report is not None:
            return ProgressRead(report, settled=not partial.strip())
    return ProgressRead(None, settled=not partial.strip() and bool(text.strip()))


def read_progress(path: Path) -> ProgressReport | None:
    """The workload's last report (see ``read_progress_file``), None when there is none yet."""
    return read_progress_file(path).report


@dataclass
class WorkerSeen:
    """What the sampler remembers of a worker between looks."""

    cpu_seconds: float | None = None
    cpu_at: float | None = None
    log_size: int = 0
    progress_mtime: float = 0.0
    # The progress file as last read whole: (mtime in ns, size); looked at again when it changes.
    progress_seen: tuple[int, int] | None = None
    report: ProgressReport | None = None
    stepped_at: float | None = None


@dataclass
class Look:
    """One look at the workers: samples, progress reports, and output activity."""

    samples: list[agent_pb2.Sample] = field(default_factory=list)
    progress: list[agent_pb2.Progress] = field(default_factory=list)


def simulated_utilization(seen: WorkerSeen, now: float, position: int = 0) -> float:
    """What the worker's ``position``-th simulated GPU shows: the workload's own figure, else
    busy while it steps."""
    reported = seen.report.utilization_of(position) if seen.report is not None else None
    if reported is not None:
        if now - seen.progress_mtime <= BUSY_WINDOW_S:
            return min(max(reported, 0.0), 1.0)
        return 0.0
    if seen.stepped_at is not None and now - seen.stepped_at <= BUSY_WINDOW_S:
        return SIMULATED_BUSY
    return 0.0


def group_rss_bytes(process_group: int, proc: Path = Path("/proc")) -> int | None:
    """The resident memory of a process group's processes (a worker without a control group);
    None when none of its processes is left."""
    total, found = 0, False
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if int(fields[2]) != process_group:  # after ")": state, ppid, pgrp
                continue
            total += int((entry / "statm").read_text().split()[1]) * page
            found = True
    return total if found else None


class Sampler:
    def __init__(
        self,
        nvml: NvmlSampler | None,
        clock: Callable[[], float] = time.time,
        gpu_memory: dict[int, int] | None = None,
    ) -> None:
        self.nvml = nvml
        self.clock = clock
        # Each simulated GPU's memory by index (its memory figure is at most that).
        self.gpu_memory = gpu_memory or {}
        self.seen: dict[int, WorkerSeen] = {}
        # The OOM kill count last sent of each worker, kept until its end is sampled (ended).
        self.oom_kills_sent: dict[int, float] = {}

    def look(
        self,
        workers: Iterable[SampledWorker],
        readings: dict[int, dict[str, float]] | None = None,
    ) -> Look:
        """One look at the running workers; ``readings`` are what an executor measured itself
        (a container's figures from its engine), by worker and metric."""
        workers = list(workers)
        # A worker that exited is remembered until its end is sampled (ended); one no longer
        # on the machine at all is forgotten.
        for gone in set(self.seen) - {w.worker_id for w in workers}:
            del self.seen[gone]
        out = Look()
        for worker in workers:
            if worker.started and not worker.exited.is_set():
                self._look_at(worker, (readings or {}).get(worker.worker_id, {}), out)
        return out

    def started(self, worker: SampledWorker, reading: dict[str, float] | None = None) -> Look:
        """The worker's first samples, taken as it starts (its process in its group): a worker
        that ends before the first look still has them. The others' are left as they are."""
        out = Look()
        if worker.started and not worker.exited.is_set():
            self._look_at(worker, reading or {}, out)
        return out

    def _look_at(self, worker: SampledWorker, reading: dict[str, float], out: Look) -> None:
        now = self.clock()
        at_ms = int(now * 1000)
        seen = self.seen.setdefault(worker.worker_id, WorkerSeen())
        self._progress(worker, seen, now, at_ms, out)
        self._cgroup(worker, seen, now, at_ms, out)
        for metric, value in reading.items():
            self._sample(out, worker, metric, at_ms, value)
            if metric == "task_oom_kills_total":
                self.oom_kills_sent[worker.worker_id] = value
        self._gpus(worker, seen, now, at_ms, out)

    def _worker_memory(self, worker: SampledWorker, out: Look) -> float:
        """The memory charged to the worker as this look measured it (its group's, its
        container's), else its process group's resident memory."""
        for sample in reversed(out.samples):
            if sample.worker_id == worker.worker_id and sample.metric == "task_memory_used_bytes":
                return sample.value
        process_group = getattr(worker, "process_group", None)
        group = process_group() if callable(process_group) else None
        if isinstance(group, int):
            return float(group_rss_bytes(group) or 0)
        return 0.0

    def _sample(
        self,
        out: Look,
        worker: SampledWorker,
        metric: str,
        at_ms: int,
        value: float,
        gpu: int | None = None,
    ) -> None:
        sample = agent_pb2.Sample(
            worker_id=worker.worker_id,
            attempt=worker.attempt,
            metric=metric,
            at_ms=at_ms,
            value=value,
        )
        if gpu is not None:
            sample.gpu = gpu
        out.samples.append(sample)

    def _progress(
        self, worker: SampledWorker, seen: WorkerSeen, now: float, at_ms: int, out: Look
    ) -> None:
        """A new report is progress with a step, dated when the file changed; new output alone
        is progress without one, dated when its last line was written (not when it was seen:
        a look comes every few seconds)."""
        reported = self._report(worker, seen, now, at_ms, out)
        size = worker.log.size()
        if size != seen.log_size:
            seen.log_size = size
            if not reported:
                written = worker.log.last_written_ms()
                out.progress.append(
                    agent_pb2.Progress(
                        worker_id=worker.worker_id,
                        attempt=worker.attempt,
                        at_ms=min(written, at_ms) if written else at_ms,
                    )
                )

    def _report(
        self, worker: SampledWorker, seen: WorkerSeen, now: float, at_ms: int, out: Look
    ) -> bool:
        """The progress file's last report, sent when it is new."""
        path = worker.progress_file
        if path is None:
            return False
        try:
            status = path.stat()
        except OSError:
            return False
        if (status.st_mtime_ns, status.st_size) == seen.progress_seen:
            return False
        read = read_progress_file(path)
        if read.settled:  # else its last line is still being written: read it again next look
            seen.progress_seen = (status.st_mtime_ns, status.st_size)
        report = read.report
        if report is None:
            return False
        seen.progress_mtime = status.st_mtime  # the workload's GPU figure is fresh while it writes
        if report == seen.report:
            return False  # the same report written again: no news, nor progress
        if seen.report is None or report.step != seen.report.step:
            seen.stepped_at = now
        seen.report = report
        progress = agent_pb2.Progress(
            worker_id=worker.worker_id,
            attempt=worker.attempt,
            at_ms=min(status.st_mtime_ns // 1_000_000, at_ms),  # a workload's future is now
        )
        progress.step = report.step
        if report.loss is not None:
            progress.loss = report.loss
        if report.checkpoint_step is not None:
            progress.checkpoint_step = report.checkpoint_step
        out.progress.append(progress)
        return True

    def _cgroup(
        self, worker: SampledWorker, seen: WorkerSeen, now: float, at_ms: int, out: Look
    ) -> None:
        group = worker.cgroup
        if group is None or not group.pids():
            return  # no group, or its process has not joined it yet: nothing of the worker's
        cpu = group.cpu_seconds()
        if cpu is not None:
            if seen.cpu_seconds is not None and seen.cpu_at is not None and now > seen.cpu_at:
                cores = max(cpu - seen.cpu_seconds, 0.0) / (now - seen.cpu_at)
                self._sample(out, worker, "task_cpu_usage_cores", at_ms, cores)
            seen.cpu_seconds, seen.cpu_at = cpu, now
        used = group.memory_used()
        if used is not None:
            self._sample(out, worker, "task_memory_used_bytes", at_ms, float(used))
        limit = worker.memory_limit_bytes
        if limit:
            self._sample(out, worker, "task_memory_limit_bytes", at_ms, float(limit))
        counted = group.oom_kills()
        if counted is None:
            return  # not known of a set of processes (agent/slurm_node.py)
        kills = float(counted)
        self._sample(out, worker, "task_oom_kills_total", at_ms, kills)
        self.oom_kills_sent[worker.worker_id] = kills

    def last_report(self, worker: SampledWorker) -> agent_pb2.Progress | None:
        """The progress file read once more as the worker ends, before its end is sent: the
        steps and the checkpoint it reported since the last look (a look comes every few
        seconds; a rank that crashes between two would take its last steps with it)."""
        seen = self.seen.get(worker.worker_id)
        if seen is None:
            return None
        now = self.clock()
        out = Look()
        self._report(worker, seen, now, int(now * 1000), out)
        return out.progress[-1] if out.progress else None

    def ended(
        self,
        worker: SampledWorker,
        oom_killed: bool,
        at_ms: int | None = None,
        *,
        oom_kill_seen: bool = False,
    ) -> list[agent_pb2.Sample]:
        """The worker's last samples, dated when it ended (``at_ms``, else now): the CPU it used
        since the last look, the memory charged to it, its limit and its OOM kill count.

        A kill of the worker's main process ends the worker and empties its group, so no look
        sees it: the group is read once more here (it stays until the worker is released).
        Killed for memory, its charge was at its limit when it ended: the group's peak (v2
        memory.peak, v1 max_usage_in_bytes), else the limit; otherwise what is still charged.
        The kill count comes from the group (v2 memory.events' ``oom_kill``, v1
        memory.oom_control's), which counts every process killed, the main one's and its
        children's. Where no group says (a container measured by its engine), a main process
        killed for memory is one more kill than was last sent (no look sees its own), and a kill
        the engine saw (``oom_kill_seen``: a child's, while the command went on) makes at least
        one."""
        seen = self.seen.pop(worker.worker_id, None)
        sent = self.oom_kills_sent.pop(worker.worker_id, None)
        now = at_ms / 1000 if at_ms is not None else self.clock()
        at = int(now * 1000)
        out = Look()
        group = worker.cgroup
        limit = worker.memory_limit_bytes
        if group is not None:
            cpu = group.cpu_seconds()
            before = (seen.cpu_seconds, seen.cpu_at) if seen else (None, None)
            if cpu is not None and before[0] is not None and before[1] and now > before[1]:
                cores = max(cpu - before[0], 0.0) / (now - before[1])
                self._sample(out, worker, "task_cpu_usage_cores", at, cores)
            used = group.memory_peak() if oom_killed else None
            if used is None:
                used = limit if oom_killed and limit else group.memory_used()
            if used is not None:
                self._sample(out, worker, "task_memory_used_bytes", at, float(used))
        elif oom_killed and limit:
            self._sample(out, worker, "task_memory_used_bytes", at, float(limit))
        if limit and (group is not None or oom_killed):
            self._sample(out, worker, "task_memory_limit_bytes", at, float(limit))
        counted = group.oom_kills() if group is not None else None
        kills: float | None
        if counted:  # 0: none, or a kernel that does not count them
            kills = float(counted)
        elif oom_killed:
            kills = (sent or 0.0) + 1
        elif oom_kill_seen:
            kills = max(sent or 0.0, 1.0)
        else:
            kills = None if counted is None else 0.0
        if kills is not None:
            self._sample(out, worker, "task_oom_kills_total", at, kills)
        return out.samples

    def _gpus(
        self, worker: SampledWorker, seen: WorkerSeen, now: float, at_ms: int, out: Look
    ) -> None:
        indexes = worker.gpu_ids
        gpus, memory = len(indexes), None
        for position, index in enumerate(indexes):
            if self.nvml is not None:
                for metric, value in self.nvml.read(int(index)).items():
                    self._sample(out, worker, metric, at_ms, value, gpu=int(index))
            else:
                busy = simulated_utilization(seen, now, position)
                self._sample(out, worker, "task_gpu_utilization_ratio", at_ms, busy, gpu=int(index))
                if memory is None:
                    memory = self._worker_memory(worker, out)
                share = simulated_memory_used(
                    memory, gpus, self.gpu_memory.get(int(index), SIMULATED_MEMORY_BYTES)
                )
                self._sample(
                    out, worker, "task_gpu_memory_used_bytes", at_ms, share, gpu=int(index)
                )
