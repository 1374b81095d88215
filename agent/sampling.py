"""When the agent samples its workers: each one's start as soon as its process is in its group,
then all of them every interval, with the GPUs' faults, and once more as each ends (the
readings: agent/metrics.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from astraeus.agent.v1 import agent_pb2

from agent import docker
from agent.config import AgentConfig
from agent.metrics import SampledWorker, Sampler
from agent.state import Outgoing, Worker
from agent.watched import WatchedWorker

log = logging.getLogger("astraeus.agent")

# A worker's first samples wait for its process to join its group (agent/enter.py does, as
# its first step: milliseconds, longer on a loaded machine), looking this often, this long.
START_SAMPLE_POLL_S = 0.02
START_SAMPLE_WAIT_S = 2.0


class Sampling:
    """The agent's sampling of what ``kept`` gives: its own workers and those it watches."""

    def __init__(
        self,
        config: AgentConfig,
        outgoing: Outgoing,
        kept: Callable[[], Sequence[SampledWorker]],
    ) -> None:
        self.config = config
        self.outgoing = outgoing
        self.kept = kept
        self.sampler = Sampler(
            config.nvml, gpu_memory={g.index: g.memory_bytes for g in config.gpus}
        )

    async def start(self, worker: Worker | WatchedWorker) -> None:
        """The worker's first samples as soon as its process is in its group (a container's
        from its engine): one killed within seconds has its start besides its end (seed L-52)."""
        group = worker.cgroup
        waited = 0.0
        while group is not None and not group.pids() and waited < START_SAMPLE_WAIT_S:
            if worker.exited.is_set():
                return
            await asyncio.sleep(START_SAMPLE_POLL_S)
            waited += START_SAMPLE_POLL_S
        reading: dict[str, float] = {}
        if isinstance(worker, docker.ContainerWorker):
            with contextlib.suppress(Exception):  # an engine that does not answer: the looks
                reading = await worker.sample()
        if not any(kept is worker for kept in self.kept()):
            return  # deleted meanwhile
        try:
            look = self.sampler.started(worker, reading)
        except Exception:  # a bad reading must not end the worker's watch
            log.exception("sampling a worker's start failed")
            return
        self._send(look.progress, look.samples)

    async def forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.sample_seconds)
            try:
                await self.once()
            except Exception:  # a bad reading must not end the sampling
                log.exception("sampling failed")

    async def once(self) -> None:
        workers = list(self.kept())
        readings = {}
        for w in workers:
            if isinstance(w, docker.ContainerWorker) and w.started and not w.exited.is_set():
                with contextlib.suppress(Exception):  # an engine that does not answer: next time
                    readings[w.worker_id] = await w.sample()
        look = self.sampler.look(workers, readings)
        self._send(look.progress, look.samples)
        if self.config.nvml is not None:
            for index, fault in self.config.nvml.faults().items():
                self.outgoing.send(gpu_health=fault.message(index))

    def last(
        self,
        worker: Worker | WatchedWorker,
        *,
        oom_killed: bool = False,
        at_ms: int | None = None,
        oom_kill_seen: bool = False,
    ) -> None:
        """Its last report and samples as it ended (a kill of its main process is seen by no
        look), sent before its end."""
        try:
            report = self.sampler.last_report(worker)
        except Exception:  # its end is sent whatever its progress file holds
            log.exception("the last read of %s's progress file failed", worker.worker_id)
            report = None
        last = self.sampler.ended(
            worker, oom_killed=oom_killed, at_ms=at_ms, oom_kill_seen=oom_kill_seen
        )
        self.outgoing.reports([report] if report is not None else [], last or [])

    def _send(self, progress: list[agent_pb2.Progress], samples: list[agent_pb2.Sample]) -> None:
        self.outgoing.reports(progress, samples)
