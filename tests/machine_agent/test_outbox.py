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


def test_metric_batches_and_progress_are_kept_in_order_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = Outbox(tmp_path)
    for _ in range(outbox_module.MAX_BATCHES + 5):
        box.put(agent_pb2.AgentMessage(id=box.next_id(), metrics=agent_pb2.MetricBatch()))
    assert len(box.pending()) == outbox_module.MAX_BATCHES
    assert box.dropped_batches == 5
    # Every report of the server's absence is kept (the recount needs each one), in order.
    for step in (1, 2, 3):
        box.put(
            agent_pb2.AgentMessage(
                id=box.next_id(), progress=agent_pb2.Progress(worker_id=41, step=step)
            )
        )
    box.put(agent_pb2.AgentMessage(id=box.next_id(), progress=agent_pb2.Progress(worker_id=42)))
    progress = [m.progress for m in box.pending() if m.WhichOneof("body") == "progress"]
    assert [(p.worker_id, p.step) for p in progress] == [(41, 1), (41, 2), (41, 3), (42, 0)]
    assert not list(tmp_path.glob("*.pb"))  # neither is written to disk

    # At most MAX_PROGRESS per worker: the oldest go first; another worker's stay.
    monkeypatch.setattr(outbox_module, "MAX_PROGRESS", 3)
    box.put(
        agent_pb2.AgentMessage(id=box.next_id(), progress=agent_pb2.Progress(worker_id=41, step=4))
    )
    progress = [m.progress for m in box.pending() if m.WhichOneof("body") == "progress"]
    assert [(p.worker_id, p.step) for p in progress] == [(41, 2), (41, 3), (42, 0), (41, 4)]
    assert box.dropped_progress == 1


def batch(box: Outbox, at_s: float) -> agent_pb2.AgentMessage:
    sample = agent_pb2.Sample(
        worker_id=41, attempt=1, metric="task_cpu_usage_cores", at_ms=int(at_s * 1000), value=1
    )
    message = agent_pb2.AgentMessage(
        id=box.next_id(), metrics=agent_pb2.MetricBatch(samples=[sample])
    )
    box.put(message)
    return message


def test_what_was_taken_more_than_an_hour_ago_goes_but_state_changes_stay(
    tmp_path: Path,
) -> None:
    box = Outbox(tmp_path)
    now = time.time()
    stale = batch(box, now - outbox_module.KEEP_SECONDS - 10)
    stale_progress = agent_pb2.AgentMessage(
        id=box.next_id(),
        progress=agent_pb2.Progress(
            worker_id=41, step=1, at_ms=int((now - outbox_module.KEEP_SECONDS - 5) * 1000)
        ),
    )
    box.put(stale_progress)
    ended = event(box)
    fresh = batch(box, now)
    assert [m.id for m in box.pending()] == [ended.id, fresh.id]
    assert stale.id not in box and (box.dropped_batches, box.dropped_progress) == (1, 1)


def test_acknowledged_samples_are_never_pending_again(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    sent = [batch(box, time.time()) for _ in range(4)]
    box.acknowledge(sent[1].id)
    assert [m.id for m in box.pending()] == [sent[2].id, sent[3].id]
