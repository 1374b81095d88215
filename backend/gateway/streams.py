"""The machines' streams a replica holds: what the server keeps for each connected machine
(what goes to it, its requests waiting for replies, its log follows, its messages waiting to
be written), the registry of them by machine, and the most a message on one may be."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from astraeus.agent.v1 import agent_pb2

from backend.gateway.follow_buffer import FollowBuffer
from backend.machine_identity.rules import MachinePrincipal

RECEIVED_MAX = 10_000


class _Closed(asyncio.Event):
    """A stream's end: set, it also wakes the stream's sender (an empty message), so the
    sender waits on its queue alone, not on two things for each message."""

    def __init__(self, outgoing: asyncio.Queue[agent_pb2.ServerMessage | None]) -> None:
        super().__init__()
        self._outgoing = outgoing

    def set(self) -> None:
        if not self.is_set():
            super().set()
            self._outgoing.put_nowait(None)


@dataclass
class MachineStream:
    """What the server holds for one connected machine."""

    machine_id: int
    # What goes to the machine; None only once the stream is closed (it wakes the sender).
    outgoing: asyncio.Queue[agent_pb2.ServerMessage | None] = field(default_factory=asyncio.Queue)
    pending: dict[int, asyncio.Future[agent_pb2.Reply]] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    last_command_sent: int = 0
    closed: asyncio.Event = field(init=False)
    # Who the stream's token speaks for: its credential is checked with all the replica's
    # streams' (CommandDelivery, backend/gateway/delivery.py).
    agent: MachinePrincipal | None = None
    # Why the server ends the stream (its credential was revoked): the agent is told so.
    refusal: str | None = None
    follows: dict[int, FollowBuffer] = field(default_factory=dict)
    # The machine's messages in the order they came, for the writer: applied to the database
    # (waiting out an outage) and acknowledged in that order. Replies are answered at once.
    # Bounded: a machine whose messages cannot be written is read no faster than they are
    # once this many wait (an hour and more of one machine's reports).
    received: asyncio.Queue[agent_pb2.AgentMessage] = field(
        default_factory=lambda: asyncio.Queue(maxsize=RECEIVED_MAX)
    )

    def __post_init__(self) -> None:
        self.closed = _Closed(self.outgoing)

    def send(self, **body: Any) -> int:
        message_id = next(self.ids)
        self.outgoing.put_nowait(agent_pb2.ServerMessage(id=message_id, **body))
        return message_id

    async def request(self, wait_s: float, **body: Any) -> agent_pb2.Reply:
        """Send a request and wait for the agent's reply to it."""
        message_id = next(self.ids)
        future: asyncio.Future[agent_pb2.Reply] = asyncio.get_running_loop().create_future()
        self.pending[message_id] = future
        self.outgoing.put_nowait(agent_pb2.ServerMessage(id=message_id, **body))
        try:
            return await asyncio.wait_for(future, wait_s)
        finally:
            self.pending.pop(message_id, None)


StreamHook = Callable[[int, bool], None]  # (machine id, held): a stream opened or closed here


class Streams:
    """The machines whose stream this process holds; ``on_change`` hears of each one taken
    or let go (the log router records which replica holds a machine)."""

    def __init__(self, on_change: StreamHook | None = None) -> None:
        self.by_machine: dict[int, MachineStream] = {}
        self.on_change = on_change or (lambda machine_id, held: None)

    def open(self, machine_id: int) -> MachineStream:
        old = self.by_machine.get(machine_id)
        if old is not None:
            old.closed.set()  # a new registration replaces an old stream
        stream = MachineStream(machine_id)
        self.by_machine[machine_id] = stream
        self.on_change(machine_id, True)
        return stream

    def close(self, stream: MachineStream) -> None:
        stream.closed.set()
        if self.by_machine.get(stream.machine_id) is stream:
            del self.by_machine[stream.machine_id]
            self.on_change(stream.machine_id, False)

    def get(self, machine_id: int) -> MachineStream | None:
        return self.by_machine.get(machine_id)


# The most a message to an agent may be: gRPC's default limit on what a channel receives
# (4 MiB), less room for the message's own framing.
MESSAGE_LIMIT = 4 * 2**20 - 64 * 2**10
SMALLER_SPEC = "make the spec's environment, command and mounts smaller"


def too_large(what: str, size: int, advice: str = SMALLER_SPEC) -> str:
    return (
        f"{what} {size / 2**20:.1f} MiB, over the {MESSAGE_LIMIT / 2**20:.1f} MiB a "
        f"machine's stream carries: {advice}."
    )
