"""When the agent samples its workers: each one's start as soon as its process is in its group,
then all of them every interval, with the GPUs' faults (the readings: agent/metrics.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from astraeus.agent.v1 import agent_pb2

from agent import docker
from agent.metrics import SampledWorker
from agent.state import AgentState, Worker
from agent.watched import WatchedWorker

log = logging.getLogger("astraeus.agent")

# A worker's first samples wait for its process to join its group (agent/enter.py does, as
# its first step: milliseconds, longer on a loaded machine), looking this often, this long.
START_SAMPLE_POLL_S = 0.02
START_SAMPLE_WAIT_S = 2.0


class Sampling(AgentState):
    """The agent's sampling (a part of ``Agent``)."""

    async def _sample_start(self, worker: Worker | WatchedWorker) -> None:
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
        key = worker.worker_id
        if self.workers.get(key) is not worker and self.watched.get(key) is not worker:
            return  # deleted meanwhile
        try:
            look = self.sampler.started(worker, reading)
        except Exception:  # a bad reading must not end the worker's watch
            log.exception("sampling a worker's start failed")
            return
        for progress in look.progress:
            self._send(progress=progress)
        if look.samples:
            self._send(metrics=agent_pb2.MetricBatch(samples=look.samples))

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.sample_seconds)
            try:
                await self.sample_once()
            except Exception:  # a bad reading must not end the sampling
                log.exception("sampling failed")

    async def sample_once(self) -> None:
        workers: list[SampledWorker] = [*self.workers.values(), *self.watched.values()]
        readings = {}
        for w in workers:
            if isinstance(w, docker.ContainerWorker) and w.started and not w.exited.is_set():
                with contextlib.suppress(Exception):  # an engine that does not answer: next time
                    readings[w.worker_id] = await w.sample()
        look = self.sampler.look(workers, readings)
        for progress in look.progress:
            self._send(progress=progress)
        if look.samples:
            self._send(metrics=agent_pb2.MetricBatch(samples=look.samples))
        if self.config.nvml is not None:
            for index, fault in self.config.nvml.faults().items():
                self._send(gpu_health=fault.message(index))
