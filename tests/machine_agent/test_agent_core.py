"""The agent's core (agent/connection.py), never connected: the server's messages handed, by
kind, to the part that carries each out; what it says back read from its queue."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from astraeus.agent.v1 import agent_pb2

from agent.connection import BACKOFF_CAP, Agent
from tests.support.agents import unconnected_agent


def said(agent: Agent) -> list[agent_pb2.AgentMessage]:
    out = []
    while not agent.outgoing.queue.empty():
        out.append(agent.outgoing.queue.get_nowait())
    return out


def ended(agent: Agent, worker_id: int, attempt: int) -> int:
    """An end reported (kept in the outbox until acknowledged): its message's id."""
    event = agent_pb2.WorkerEvent(
        worker_id=worker_id, attempt=attempt, state=agent_pb2.WORKER_STATE_EXITED
    )
    agent.outgoing.send(worker_event=event)
    agent.workers.ended[worker_id] = attempt
    return max(agent.outgoing.outbox.messages)


async def test_an_end_is_named_in_the_hello_until_the_server_acknowledges_it(
    tmp_path: Path,
) -> None:
    agent = unconnected_agent(tmp_path / "data")
    first, second = ended(agent, 9, 2), ended(agent, 12, 1)
    known = [(k.worker_id, k.attempt, k.ended) for k in agent._hello().hello.workers]
    assert known == [(9, 2, True), (12, 1, True)]
    await agent._handle(agent_pb2.ServerMessage(ack=agent_pb2.Ack(up_to=first)))
    assert agent.workers.ended == {12: 1} and list(agent.outgoing.outbox.messages) == [second]
    await agent._handle(agent_pb2.ServerMessage(ack=agent_pb2.Ack(up_to=second)))
    assert agent.workers.ended == {} and not agent._hello().hello.workers


async def test_a_command_is_carried_out_by_its_part_and_acknowledged(tmp_path: Path) -> None:
    agent = unconnected_agent(tmp_path / "data")
    stop = agent_pb2.Command(command_id=41, kind=agent_pb2.COMMAND_KIND_STOP, worker_id=7)
    await agent._handle(agent_pb2.ServerMessage(command=stop))  # a worker it does not have
    (ack,) = said(agent)
    assert ack.command_ack == agent_pb2.CommandAck(command_ids=[41])
    assert ack.id in agent.outgoing.outbox  # kept until the server has it


async def test_the_welcome_sets_the_beat_and_the_reconnects_by_the_lease(tmp_path: Path) -> None:
    agent = unconnected_agent(tmp_path / "data", heartbeat_seconds=10)
    welcome = agent_pb2.Welcome(machine_id=3, lease_seconds=12)
    await agent._handle(agent_pb2.ServerMessage(welcome=welcome))
    assert (agent.beat_every, agent.reconnects.cap) == (4.0, 3.0)
    await agent._handle(agent_pb2.ServerMessage(welcome=agent_pb2.Welcome(lease_seconds=600)))
    assert (agent.beat_every, agent.reconnects.cap) == (10, BACKOFF_CAP)


async def test_a_message_of_no_kind_is_ignored(tmp_path: Path) -> None:
    agent = unconnected_agent(tmp_path / "data")
    await agent._handle(agent_pb2.ServerMessage(id=5))  # a body of a later server's protocol
    assert said(agent) == [] and agent.beat_every == 0.0


async def test_a_beat_goes_only_after_an_interval_in_which_nothing_else_went(
    tmp_path: Path,
) -> None:
    """Any message tells the server the machine lives (issue 40: a busy fleet's beats were a
    fifth of its messages): reports every 0.3 s leave no beat due; then silence brings one."""
    agent = unconnected_agent(tmp_path / "data", heartbeat_seconds=1)
    beats = asyncio.create_task(agent._heartbeats())
    try:
        for _ in range(8):  # 2.4 s of reports, over two intervals
            agent.outgoing.send(progress=agent_pb2.Progress(worker_id=7, attempt=1, at_ms=1))
            await asyncio.sleep(0.3)
        kinds = [m.WhichOneof("body") for m in said(agent)]
        assert kinds == ["progress"] * 8
        await asyncio.sleep(1.5)  # silent for over an interval
        assert [m.WhichOneof("body") for m in said(agent)] == ["heartbeat"]
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats


async def test_a_periods_reports_go_as_one_report_to_a_server_that_takes_it(
    tmp_path: Path,
) -> None:
    """Protocol 4 (issue 40): a Welcome of protocol 4 or more takes a Report, a period's
    progress and samples in one message; an older server's, each apart, as it knows them."""
    agent = unconnected_agent(tmp_path / "data")
    progress = [agent_pb2.Progress(worker_id=w, attempt=1, step=3) for w in (7, 8)]
    samples = [agent_pb2.Sample(worker_id=7, metric="task_cpu_usage_cores", value=1.0)]
    await agent._handle(agent_pb2.ServerMessage(welcome=agent_pb2.Welcome(lease_seconds=60)))
    agent.outgoing.reports(progress, samples)
    assert [m.WhichOneof("body") for m in said(agent)] == ["progress", "progress", "metrics"]
    welcome = agent_pb2.Welcome(lease_seconds=60, protocol=4)
    await agent._handle(agent_pb2.ServerMessage(welcome=welcome))
    agent.outgoing.reports(progress, samples)
    agent.outgoing.reports([], [])  # nothing to say: nothing sent
    (one,) = said(agent)
    assert list(one.report.progress) == progress and list(one.report.metrics.samples) == samples
    assert one.id in agent.outgoing.outbox  # kept until the server has it, as the others
