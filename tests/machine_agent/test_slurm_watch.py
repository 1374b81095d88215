"""A Slurm node agent's watch (agent/slurm_watch.py), alone: made with what it needs, its node's
``scontrol listpids`` a script reading a file the test writes, its messages read from its
queue."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from astraeus.agent.v1 import agent_pb2

from agent.config import AgentConfig
from agent.gpus import simulated
from agent.log_replies import LogReplies
from agent.outbox import Outbox
from agent.sampling import Sampling
from agent.slurm_watch import SlurmWatch
from agent.state import Background, Outgoing

JOB = "4242"
HEADER = "PID      JOBID    STEPID   LOCALID GLOBALID\n"


@dataclass
class Node:
    watch: SlurmWatch
    outgoing: Outgoing
    listpids: Path  # what the node's scontrol lists


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    bin = tmp_path / "bin"
    bin.mkdir()
    listpids = tmp_path / "listpids"
    listpids.write_text(HEADER)
    scontrol = bin / "scontrol"
    scontrol.write_text(f"#!/bin/sh\ncat {listpids}\n")
    scontrol.chmod(0o755)
    config = AgentConfig(
        server="127.0.0.1:1",
        token="unused",
        machine="node-1",
        data_dir=tmp_path / "data",
        gpus=simulated(1, "node-1"),
        cpu_cores=2,
        memory_bytes=2**30,
        executor="slurm",
        slurm_bin=str(bin),
    )
    outgoing = Outgoing(Outbox(tmp_path / "outbox"))
    background = Background()
    sampling = Sampling(config, outgoing, lambda: list(watch.watched.values()))
    logs = LogReplies(config.log_root, outgoing, background, lambda key: watch.watched.get(key))
    watch = SlurmWatch(config, outgoing, background, sampling, logs)
    try:
        yield Node(watch, outgoing, listpids)
    finally:
        if watch.watching is not None:
            watch.watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch.watching


def command(kind: agent_pb2.CommandKind.ValueType, attempt: int = 1) -> agent_pb2.Command:
    watched = agent_pb2.WatchWorker(worker="sim-0", attempt=attempt, slurm_job_id=JOB)
    return agent_pb2.Command(command_id=1, kind=kind, worker_id=7, watch=watched)


def sent(outgoing: Outgoing) -> list[agent_pb2.AgentMessage]:
    out = []
    while not outgoing.queue.empty():
        out.append(outgoing.queue.get_nowait())
    return out


async def until(what: str, check: object, seconds: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"waited for {what}"
        await asyncio.sleep(0.02)


async def test_a_watch_sent_again_is_kept_a_new_attempt_replaces_it_a_delete_forgets_it(
    node: Node,
) -> None:
    await node.watch.watch(command(agent_pb2.COMMAND_KIND_WATCH))
    first = node.watch.watched[7]
    first.log.append(b"step 1\n")
    await node.watch.watch(command(agent_pb2.COMMAND_KIND_WATCH))  # a Hello, a reconnect
    assert node.watch.watched[7] is first and not first.exited.is_set()
    await node.watch.watch(command(agent_pb2.COMMAND_KIND_WATCH, attempt=2))  # queued again
    second = node.watch.watched[7]
    assert (second.attempt, first.exited.is_set(), second.log.snapshot()) == (2, True, "")
    await node.watch.delete(command(agent_pb2.COMMAND_KIND_DELETE, attempt=2))
    assert node.watch.watched == {} and not second.log.folder.exists()
    assert sent(node.outgoing) == []  # Slurm starts and ends it: no state of it is reported


async def test_a_worker_whose_processes_go_is_finished_and_a_stop_then_sends_its_last_lines(
    node: Node,
) -> None:
    task = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        node.listpids.write_text(HEADER + f"{task.pid} {JOB} 0 0 0\n")
        await node.watch.watch(command(agent_pb2.COMMAND_KIND_WATCH))
        worker = node.watch.watched[7]
        await until("its processes seen", lambda: worker.started)
        worker.log.append(b"loss 0.5\n")
        node.listpids.write_text(HEADER)  # its job ended on the node
        await until("its end", lambda: 7 not in node.watch.watched)
    finally:
        task.kill()
        await task.wait()
    assert worker.exited.is_set() and worker.log.archived.exists()
    kinds = [m.WhichOneof("body") for m in sent(node.outgoing)]
    assert "worker_event" not in kinds and "metrics" in kinds  # its last samples, no state
    await node.watch.ended(command(agent_pb2.COMMAND_KIND_STOP))  # the server recorded its end
    (snapshot,) = sent(node.outgoing)
    assert snapshot.worker_event == agent_pb2.WorkerEvent(
        worker_id=7,
        attempt=0,
        state=agent_pb2.WORKER_STATE_EXITED,
        at_ms=snapshot.worker_event.at_ms,
        log_tail="loss 0.5\n",
    )


async def test_a_stop_while_watched_ends_the_watch_and_sends_its_last_lines(node: Node) -> None:
    await node.watch.watch(command(agent_pb2.COMMAND_KIND_WATCH))
    node.watch.watched[7].log.append(b"step 3\n")
    await node.watch.ended(command(agent_pb2.COMMAND_KIND_STOP))
    await until("its end", lambda: 7 not in node.watch.watched)
    events = [m.worker_event for m in sent(node.outgoing) if m.HasField("worker_event")]
    assert [(e.attempt, e.state, e.log_tail) for e in events] == [
        (1, agent_pb2.WORKER_STATE_EXITED, "step 3\n")
    ]
