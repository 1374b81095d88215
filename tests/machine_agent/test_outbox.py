"""The agent's outbox: what it kept survives a restart, ids only grow, memory and disk stay
bounded."""

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
    # On disk as in memory: a file each, the dropped ones' removed.
    assert len(list(tmp_path.glob("*.pb"))) == outbox_module.MAX_BATCHES + 4

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


def test_samples_and_progress_kept_while_the_server_is_away_survive_a_restart(
    tmp_path: Path,
) -> None:
    # issue 36: `astraeus up`'s agent replaced after a crash of `up` loses none of them
    box = Outbox(tmp_path)
    taken = [batch(box, time.time()) for _ in range(3)]
    report = agent_pb2.AgentMessage(
        id=box.next_id(),
        progress=agent_pb2.Progress(worker_id=41, step=7, at_ms=int(time.time() * 1000)),
    )
    box.put(report)
    box.acknowledge(taken[0].id)
    (tmp_path / f"{box.next_id():020d}.partial").write_bytes(b"cut short")

    again = Outbox(tmp_path)  # the agent killed and started again
    assert again.pending() == [taken[1], taken[2], report]
    assert again.next_id() > report.id
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{m.id:020d}.pb" for m in (taken[1], taken[2], report)
    ]
    assert {p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {0o600}


def test_what_a_restarted_agent_finds_on_disk_is_bounded_as_what_it_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = Outbox(tmp_path)
    now = time.time()
    stale = batch(box, now - 60)
    fresh = [batch(box, now) for _ in range(3)]
    progress = [
        agent_pb2.AgentMessage(
            id=box.next_id(),
            progress=agent_pb2.Progress(worker_id=w, step=s, at_ms=int(now * 1000)),
        )
        for w, s in ((41, 1), (41, 2), (42, 1), (41, 3))
    ]
    for message in progress:
        box.put(message)
    ended = event(box)

    monkeypatch.setattr(outbox_module, "KEEP_SECONDS", 30.0)
    monkeypatch.setattr(outbox_module, "MAX_BATCHES", 2)
    monkeypatch.setattr(outbox_module, "MAX_PROGRESS", 2)
    again = Outbox(tmp_path)
    assert [m.id for m in again.pending()] == [
        fresh[1].id,
        fresh[2].id,
        progress[1].id,
        progress[2].id,
        progress[3].id,
        ended.id,
    ]
    assert (again.dropped_batches, again.dropped_progress) == (2, 1)
    assert stale.id not in again
    assert len(list(tmp_path.glob("*.pb"))) == 6


def report(box: Outbox, at_s: float) -> agent_pb2.AgentMessage:
    """A sample period's Report (protocol 4): a worker's progress and its samples."""
    at_ms = int(at_s * 1000)
    sample = agent_pb2.Sample(worker_id=41, metric="task_cpu_usage_cores", at_ms=at_ms, value=1)
    message = agent_pb2.AgentMessage(
        id=box.next_id(),
        report=agent_pb2.Report(
            progress=[agent_pb2.Progress(worker_id=41, step=1, at_ms=at_ms)],
            metrics=agent_pb2.MetricBatch(samples=[sample]),
        ),
    )
    box.put(message)
    return message


def test_reports_are_kept_on_disk_and_bounded_as_the_batches_they_replace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40: a Report holds what a metric batch and the progress reports held, so it is
    kept as they are while the server is away: on disk (a restarted agent finds it), at most
    MAX_BATCHES of them and of batches together, none older than KEEP_SECONDS."""
    monkeypatch.setattr(outbox_module, "MAX_BATCHES", 3)
    box = Outbox(tmp_path)
    now = time.time()
    stale = report(box, now - outbox_module.KEEP_SECONDS - 10)
    kept = [report(box, now - 20), batch(box, now - 15), report(box, now - 10)]
    assert [m.id for m in box.pending()] == [m.id for m in kept]  # the stale one went by age
    assert stale.id not in box and box.dropped_batches == 1
    newest = report(box, now - 5)  # a fourth: the oldest of the three goes
    assert [m.id for m in box.pending()] == [kept[1].id, kept[2].id, newest.id]
    again = Outbox(tmp_path)  # the agent started again: what it finds on disk
    assert [m.id for m in again.pending()] == [kept[1].id, kept[2].id, newest.id]
    assert again.pending()[2].report == newest.report
