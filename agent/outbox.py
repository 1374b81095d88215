"""What the agent has said and the server has not yet acknowledged, kept until it has.

State changes, failure snapshots, command acknowledgements and GPU faults are written to
disk before they are sent, so neither a lost stream nor a restart of the agent loses one.
Metric batches wait in memory only, at most ``MAX_BATCHES`` of them (an hour at one batch
every five seconds); past that the oldest go, and the agent says how many. Progress waits in
memory too, only the latest report of each worker (the next look reports it again anyway).

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
DURABLE = {"worker_event", "command_ack", "gpu_health"}


class Outbox:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.messages: OrderedDict[int, agent_pb2.AgentMessage] = OrderedDict()
        self.dropped_batches = 0
        for path in sorted(folder.glob("*.pb")):
            with contextlib.suppress(ValueError, OSError):
                message = agent_pb2.AgentMessage.FromString(path.read_bytes())
                self.messages[message.id] = message
        highest = max(self.messages, default=0)
        self._next = max(int(time.time() * 1_000_000), highest + 1)

    def next_id(self) -> int:
        self._next += 1
        return self._next

    def put(self, message: agent_pb2.AgentMessage) -> None:
        """Keep the message until acknowledged: on disk when it must survive a restart."""
        if message.WhichOneof("body") in DURABLE:
            path = self.folder / f"{message.id:020d}.pb"
            partial = path.with_suffix(".partial")
            with partial.open("wb") as f:
                f.write(message.SerializeToString())
                f.flush()
                os.fsync(f.fileno())
            partial.replace(path)
        elif message.WhichOneof("body") == "metrics":
            self._bound_batches()
        elif message.WhichOneof("body") == "progress":
            worker_id = message.progress.worker_id
            for earlier in [
                i
                for i, m in self.messages.items()
                if m.WhichOneof("body") == "progress" and m.progress.worker_id == worker_id
            ]:
                del self.messages[earlier]
        self.messages[message.id] = message

    def _bound_batches(self) -> None:
        batches = [i for i, m in self.messages.items() if m.WhichOneof("body") == "metrics"]
        for message_id in batches[: max(len(batches) - MAX_BATCHES + 1, 0)]:
            del self.messages[message_id]
            self.dropped_batches += 1
            if self.dropped_batches in (1, 100) or self.dropped_batches % 1000 == 0:
                log.warning(
                    "the server is out of reach: %d metric batches dropped", self.dropped_batches
                )

    def acknowledge(self, up_to: int) -> None:
        for message_id in [i for i in self.messages if i <= up_to]:
            message = self.messages.pop(message_id)
            if message.WhichOneof("body") in DURABLE:
                (self.folder / f"{message_id:020d}.pb").unlink(missing_ok=True)

    def pending(self) -> list[agent_pb2.AgentMessage]:
        return [self.messages[i] for i in sorted(self.messages)]

    def __contains__(self, message_id: int) -> bool:
        return message_id in self.messages
