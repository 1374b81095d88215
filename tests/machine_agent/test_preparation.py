"""A worker's preparation (agent/preparation.py), alone: made with its settings, where it says
things (its queue, read here) and what ends a worker before its start (recorded here)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from astraeus.agent.v1 import agent_pb2

from agent import prepare
from agent.config import AgentConfig
from agent.executor import EndCause, Exit, ProcessWorker
from agent.gpus import simulated
from agent.identity import WorkloadUsers
from agent.logs import WorkerLog
from agent.outbox import Outbox
from agent.preparation import Preparation
from agent.start import Credential, Mount, StartSpec
from agent.state import Outgoing, Worker

pytestmark = pytest.mark.unit  # no server, no process: the fast lane

POLL_S = 0.05


class Prepared:
    def __init__(self, tmp_path: Path) -> None:
        config = AgentConfig(
            server="127.0.0.1:1",
            token="unused",
            machine="gpu-07",
            data_dir=tmp_path / "data",
            gpus=simulated(1, "gpu-07"),
            cpu_cores=8,
            memory_bytes=2**30,
            prepare_poll_seconds=POLL_S,
            users=WorkloadUsers(switch=False),
        )
        self.outgoing = Outgoing(Outbox(tmp_path / "outbox"))
        self.ends: list[tuple[int, Exit]] = []
        self.preparation = Preparation(config, self.outgoing, self.ended)
        self.tmp_path = tmp_path

    def ended(self, worker: Worker, exit: Exit) -> None:
        self.ends.append((worker.worker_id, exit))

    def worker(self, spec: StartSpec) -> ProcessWorker:
        return ProcessWorker(9, spec, WorkerLog(self.tmp_path / "logs", "9"), self.tmp_path / "9")

    async def said(self) -> agent_pb2.AgentMessage:
        return await asyncio.wait_for(self.outgoing.queue.get(), 5)


@pytest.fixture
def prepared(tmp_path: Path) -> Prepared:
    return Prepared(tmp_path)


def state(message: agent_pb2.AgentMessage) -> tuple[int, int, str]:
    event = message.worker_event
    return event.state, event.waits_for, event.waits_on


async def test_a_worker_with_nothing_to_prepare_is_ready_at_once(prepared: Prepared) -> None:
    prepared.preparation.begin(prepared.worker(StartSpec(attempt=1)))
    assert prepared.preparation.preparing == {}
    assert state(prepared.outgoing.queue.get_nowait()) == (agent_pb2.WORKER_STATE_READY, 0, "")


async def test_a_worker_waits_for_its_secret_until_the_server_has_it(prepared: Prepared) -> None:
    spec = StartSpec(attempt=1, credentials=(Credential("hf-token", env="HF_TOKEN"),))
    worker = prepared.worker(spec)
    prepared.preparation.begin(worker)
    asked = await prepared.said()
    assert asked.secret_request == agent_pb2.SecretRequest(worker_id=9, attempt=1)
    # the server does not answer in time: the worker waits for the secret, named
    waiting = await prepared.said()
    assert state(waiting) == (agent_pb2.WORKER_STATE_PREPARING, agent_pb2.WAIT_SECRET, "hf-token")
    answer = agent_pb2.SecretValues(worker_id=9, values={"hf-token": "hf_abc"})
    while (said := await prepared.said()).HasField("secret_request"):  # asked again
        prepared.preparation.answered(answer)  # (late on a loaded machine: asked once more)
    assert state(said) == (agent_pb2.WORKER_STATE_READY, 0, "")
    assert worker.secrets == {"hf-token": "hf_abc"} and prepared.ends == []
    await asyncio.sleep(0)  # its task is done: no longer being prepared
    assert prepared.preparation.preparing == {}


async def test_a_drive_this_machine_may_not_fill_ends_the_worker_before_its_start(
    prepared: Prepared,
) -> None:
    source = str(prepared.tmp_path / "set")
    spec = StartSpec(attempt=1, mounts=(Mount("data", "data", fill_from=source),))
    prepared.preparation.begin(prepared.worker(spec))
    waiting = await prepared.said()
    assert state(waiting) == (agent_pb2.WORKER_STATE_PREPARING, agent_pb2.WAIT_DRIVE, "data")
    await asyncio.wait_for(prepared.preparation.preparing[9], 5)
    assert prepared.ends == [(9, Exit(None, EndCause.NOT_STARTED, detail=prepare.FILL_NOT_ALLOWED))]


async def test_a_preparation_cancelled_says_nothing_more(prepared: Prepared) -> None:
    spec = StartSpec(attempt=1, credentials=(Credential("hf-token", env="HF_TOKEN"),))
    prepared.preparation.begin(prepared.worker(spec))
    assert (await prepared.said()).HasField("secret_request")
    prepared.preparation.cancel(9)  # a STOP or a DELETE before its start
    await asyncio.sleep(POLL_S * 4)
    assert prepared.outgoing.queue.empty() and prepared.preparation.preparing == {}
