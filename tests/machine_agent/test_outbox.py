"""The agent's outbox: what must survive a restart does, ids only grow, memory stays bounded."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from astraeus.agent.v1 import agent_pb2

from agent import outbox as outbox_module
from agent.outbox import Outbox


def event(box: Outbox, worker_id: int = 41) -> agent_pb2.AgentMessage:
    message = agent_pb2.AgentMessage(
        id=box.next_id(),
        worker_event=agent_pb2.WorkerEvent(
            worker_id=worker_id, attempt=1, state=agent_pb2.WORKER_STATE_EXITED, log_tail="boom\n"
        ),
    )
    box.put(message)
    return message


def test_state_changes_survive_a_restart_until_acknowledged(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    first, second = event(box), event(box, 42)
    box.put(agent_pb2.AgentMessage(id=box.next_id(), heartbeat=agent_pb2.Heartbeat()))

    again = Outbox(tmp_path)  # the agent restarted
    assert [m.id for m in again.pending()] == [first.id, second.id]
    assert again.pending()[0].worker_event.log_tail == "boom\n"
    assert again.next_id() > second.id

    again.acknowledge(first.id)
    assert [m.id for m in Outbox(tmp_path).pending()] == [second.id]
    assert len(list(tmp_path.glob("*.pb"))) == 1


def test_ids_only_grow_across_restarts_even_when_the_clock_goes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = Outbox(tmp_path)
    sent = event(box)
    an_hour_ago = time.time() - 3600
    monkeypatch.setattr(outbox_module.time, "time", lambda: an_hour_ago)
    assert Outbox(tmp_path).next_id() > sent.id


def test_metric_batches_are_bounded_and_progress_keeps_only_the_latest(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    for _ in range(outbox_module.MAX_BATCHES + 5):
        box.put(agent_pb2.AgentMessage(id=box.next_id(), metrics=agent_pb2.MetricBatch()))
    assert len(box.pending()) == outbox_module.MAX_BATCHES
    assert box.dropped_batches == 5
    for step in (1, 2, 3):
        box.put(
            agent_pb2.AgentMessage(
                id=box.next_id(), progress=agent_pb2.Progress(worker_id=41, step=step)
            )
        )
    box.put(agent_pb2.AgentMessage(id=box.next_id(), progress=agent_pb2.Progress(worker_id=42)))
    progress = [m.progress for m in box.pending() if m.WhichOneof("body") == "progress"]
    assert [(p.worker_id, p.step) for p in progress] == [(41, 3), (42, 0)]
    assert not list(tmp_path.glob("*.pb"))  # neither is written to disk
