"""What the agent has said and the server has not yet acknowledged, kept until it has, on
disk (a file a message, 0600, in a folder of the agent's alone), so that neither a lost stream
nor a restart of the agent loses any of it.

State changes, failure snapshots, command acknowledgements and GPU faults are on disk (synced)
before they are sent. While the server is away the agent keeps measuring, and keeps what it
measured, bounded: the metric batches and reports (a sample period's progress and samples in
one message, protocol 4) of the last ``KEEP_SECONDS`` (an hour), at most ``MAX_BATCHES`` of
them (an hour at one every five seconds), and every progress report sent apart (a step, or new
output) of the last hour, at most ``MAX_PROGRESS`` per worker. Past a bound the
oldest go first, and the agent says how many went. They are written as they are taken, not
synced: an agent killed or started again (or `astraeus up`'s, replaced by the next `up` after a
crash of the first) loses none; a crash of the machine itself, which ends its workers too, may
lose the last seconds. The bounds hold for what an agent finds on disk when it starts. When the
server is back they are sent in the order they were taken (ids only grow), each once per
stream; what the server acknowledged is never sent again, and a sample it already stored (sent,
then the stream broke before the acknowledgement) is recognised there and not stored twice.

Message ids only grow, across restarts too: they start from the clock (in microseconds) or
past the highest id still on disk, whichever is larger, so an acknowledgement "up to id N"
never covers a message sent after it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import OrderedDict
from pathlib import Path

from astraeus.agent.v1 import agent_pb2

log = logging.getLogger("astraeus.agent")

MAX_BATCHES = 720
MAX_PROGRESS = 720  # per worker: an hour of looks at one every five seconds
KEEP_SECONDS = 3600.0
DURABLE = {"worker_event", "command_ack", "gpu_health"}
MEASURED = {"metrics", "progress", "report"}  # on disk too, not synced
PERIODS = {"metrics", "report"}  # one a sample period: bounded together (MAX_BATCHES)


class Outbox:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.messages: OrderedDict[int, agent_pb2.AgentMessage] = OrderedDict()
        self.dropped_batches = 0
        self.dropped_progress = 0
        for path in folder.glob("*.partial"):  # a write its agent did not finish
            path.unlink(missing_ok=True)
        for path in sorted(folder.glob("*.pb")):
            with contextlib.suppress(ValueError, OSError):
                message = agent_pb2.AgentMessage.FromString(path.read_bytes())
                self.messages[message.id] = message
        highest = max(self.messages, default=0)
        self._next = max(int(time.time() * 1_000_000), highest + 1)
        self._bound_found()

    def next_id(self) -> int:
        self._next += 1
        return self._next

    def put(self, message: agent_pb2.AgentMessage) -> None:
        """Keep the message until acknowledged, on disk."""
        kind = message.WhichOneof("body")
        if kind in PERIODS:
            self._bound_batches(MAX_BATCHES - 1)
        elif kind == "progress":
            self._bound_progress(message.progress.worker_id, MAX_PROGRESS - 1)
        if kind in DURABLE or kind in MEASURED:
            self._write(message, synced=kind in DURABLE)
        self.messages[message.id] = message
        self._drop_older_than(time.time() - KEEP_SECONDS)

    def _path(self, message_id: int) -> Path:
        return self.folder / f"{message_id:020d}.pb"

    def _write(self, message: agent_pb2.AgentMessage, *, synced: bool) -> None:
        """The message's file, whole or not at all (a partial one is removed at the next
        start); synced to the disk when a crash of the machine must not lose it either."""
        path = self._path(message.id)
        partial = path.with_suffix(".partial")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
        with os.fdopen(os.open(partial, flags, 0o600), "wb") as f:
            f.write(message.SerializeToString())
            if synced:
                f.flush()
                os.fsync(f.fileno())
        partial.replace(path)

    def _bound_found(self) -> None:
        """What an earlier agent left on disk, within the bounds a running one keeps."""
        self._drop_older_than(time.time() - KEEP_SECONDS)
        self._bound_batches(MAX_BATCHES)
        workers = {m.progress.worker_id for m in self.messages.values() if m.HasField("progress")}
        for worker_id in sorted(workers):
            self._bound_progress(worker_id, MAX_PROGRESS)

    def _bound_batches(self, keep: int) -> None:
        batches = [i for i, m in self.messages.items() if m.WhichOneof("body") in PERIODS]
        for message_id in batches[: max(len(batches) - keep, 0)]:
            self._drop(message_id)

    def _bound_progress(self, worker_id: int, keep: int) -> None:
        reports = [
            i
            for i, m in self.messages.items()
            if m.WhichOneof("body") == "progress" and m.progress.worker_id == worker_id
        ]
        for message_id in reports[: max(len(reports) - keep, 0)]:
            self._drop(message_id)

    def _drop_older_than(self, cutoff_s: float) -> None:
        """Samples and progress taken before ``cutoff_s`` go; kept messages are in id order,
        and ids follow the clock, so the oldest are first."""
        cutoff_ms = cutoff_s * 1000
        for message_id, message in list(self.messages.items()):
            taken = _taken_ms(message)
            if taken is None:
                continue
            if taken >= cutoff_ms:
                break
            self._drop(message_id)

    def _drop(self, message_id: int) -> None:
        message = self.messages.pop(message_id)
        self._path(message_id).unlink(missing_ok=True)
        if message.WhichOneof("body") in PERIODS:
            self.dropped_batches += 1
            dropped, what = self.dropped_batches, "metric batches and reports"
        else:
            self.dropped_progress += 1
            dropped, what = self.dropped_progress, "progress reports"
        if dropped in (1, 100) or dropped % 1000 == 0:
            log.warning("the server is out of reach: %d %s dropped", dropped, what)

    def acknowledge(self, up_to: int) -> None:
        for message_id in [i for i in self.messages if i <= up_to]:
            del self.messages[message_id]
            self._path(message_id).unlink(missing_ok=True)

    def pending(self) -> list[agent_pb2.AgentMessage]:
        return [self.messages[i] for i in sorted(self.messages)]

    def __contains__(self, message_id: int) -> bool:
        return message_id in self.messages


def _taken_ms(message: agent_pb2.AgentMessage) -> int | None:
    """When a sample batch, a progress report or a report of both was taken (Unix ms); None
    for what is kept whatever its age (state changes, acknowledgements, GPU faults)."""
    kind = message.WhichOneof("body")
    if kind == "metrics" and message.metrics.samples:
        return max(s.at_ms for s in message.metrics.samples)
    if kind == "progress":
        return message.progress.at_ms or None
    if kind == "report":
        report = message.report
        taken = [s.at_ms for s in report.metrics.samples] + [p.at_ms for p in report.progress]
        return max(taken, default=0) or None
    return None
