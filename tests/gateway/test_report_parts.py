"""A Report (protocol 4, issue 40) is written as the messages it stands for: its parts carry
its id and go in one group, never split between two (it is acknowledged once all are written),
and a group still holds at most one sample batch."""

from __future__ import annotations

import asyncio

from astraeus.agent.v1 import agent_pb2

from agent.state import REPORT_PROGRESS, period_bodies
from backend.gateway.handlers import MessageHandlers
from backend.gateway.streams import Streams
from backend.gateway.writer import GROUP_MAX, MAX_REPORT_PROGRESS, _group, parts, report_refusal
from tests.support import FakeClock

HANDLERS = MessageHandlers(FakeClock(), Streams())


def report(message_id: int, workers: int, samples: bool = True) -> agent_pb2.AgentMessage:
    progress = [agent_pb2.Progress(worker_id=w, attempt=1, step=7) for w in range(1, workers + 1)]
    batch = agent_pb2.MetricBatch(
        samples=[agent_pb2.Sample(worker_id=1, metric="task_cpu_usage_cores")] if samples else []
    )
    return agent_pb2.AgentMessage(
        id=message_id, report=agent_pb2.Report(progress=progress, metrics=batch)
    )


def kinds(messages: list[agent_pb2.AgentMessage]) -> list[tuple[int, str | None]]:
    return [(m.id, m.WhichOneof("body")) for m in messages]


def waiting(*messages: agent_pb2.AgentMessage) -> asyncio.Queue[agent_pb2.AgentMessage]:
    queue: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
    for m in messages:
        queue.put_nowait(m)
    return queue


def test_a_report_is_its_progress_then_its_samples_with_its_id() -> None:
    assert kinds(parts(report(5, 2))) == [(5, "progress"), (5, "progress"), (5, "metrics")]
    assert parts(report(6, 1))[0].progress.step == 7
    assert kinds(parts(report(7, 0, samples=False))) == [(7, "heartbeat")]  # only a sign of life
    other = agent_pb2.AgentMessage(id=8, heartbeat=agent_pb2.Heartbeat())
    assert parts(other) == [other]


def test_a_report_is_never_split_between_groups() -> None:
    # a second sample batch ends the group: the report that holds it waits whole for the next
    group, carried = _group(report(1, 2), waiting(report(2, 3), report(3, 1)), HANDLERS)
    assert kinds(group) == [(1, "progress"), (1, "progress"), (1, "metrics")]
    assert carried is not None and carried.id == 2
    # reports without samples join the group while it has room for each whole
    many = [report(i, 10, samples=False) for i in range(2, 9)]
    group, carried = _group(report(1, 2), waiting(*many), HANDLERS)
    assert len(group) <= GROUP_MAX and {m.id for m in group} == {1, 2, 3, 4, 5}
    assert carried is not None and carried.id == 6
    # a worker's event is written alone, after the group
    event = agent_pb2.AgentMessage(id=9, worker_event=agent_pb2.WorkerEvent(worker_id=1))
    group, carried = _group(report(1, 1), waiting(event), HANDLERS)
    assert kinds(group) == [(1, "progress"), (1, "metrics")] and carried is event


def test_a_report_of_more_progress_than_a_report_holds_is_refused() -> None:
    """A forged agent's Report of 4 MiB of progress entries (about 200 000) would hold the
    writers' transaction as long: one of more than a report holds is refused, cheaply, and
    says the bound. The agent never sends one: a period of more workers is several reports."""
    assert report_refusal(report(1, MAX_REPORT_PROGRESS)) is None
    assert report_refusal(agent_pb2.AgentMessage(id=2, heartbeat=agent_pb2.Heartbeat())) is None
    refusal = report_refusal(report(3, MAX_REPORT_PROGRESS + 1))
    assert refusal == (
        "a Report of 1025 progress entries refused (at most 1024 a report, one a worker): "
        "nothing of it written"
    )
    assert REPORT_PROGRESS == MAX_REPORT_PROGRESS
    progress = [agent_pb2.Progress(worker_id=w, attempt=1) for w in range(1, 2501)]
    sample = agent_pb2.Sample(worker_id=1, metric="task_cpu_usage_cores")
    bodies = period_bodies(progress, [sample], reports=True)
    sent = [body["report"] for body in bodies]
    assert [len(r.progress) for r in sent] == [1024, 1024, 452]
    assert [len(r.metrics.samples) for r in sent] == [1, 0, 0]
    assert [p.worker_id for r in sent for p in r.progress] == list(range(1, 2501))
    assert all(report_refusal(agent_pb2.AgentMessage(report=r)) is None for r in sent)
