"""The server's commands to this agent, each handed to the part that carries it out: a table
from a command's kind to its handler, made for the agent's executor (``for_executor``).

A machine running workers: START (prepare, then wait at the gang barrier), RELEASE (the barrier
is passed: run), STOP and DELETE go to its workers (agent/workers.py). A Slurm node's agent
runs none: WATCH, STOP and DELETE go to its watch of what Slurm runs (agent/slurm_watch.py),
any other is said and ignored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from astraeus.agent.v1 import agent_pb2

Handler = Callable[[agent_pb2.Command], Awaitable[None]]
Table = Mapping[agent_pb2.CommandKind.ValueType, Handler]
SLURM = "slurm"  # the executor of a Slurm node's agent (agent/slurm_watch.py)


class Commands:
    """The handler of each kind of command; ``otherwise`` for the kinds the table lacks."""

    def __init__(self, table: Table, otherwise: Handler | None = None) -> None:
        self.table = dict(table)
        self.otherwise = otherwise

    async def carry_out(self, command: agent_pb2.Command) -> None:
        if not command.worker_id:
            return  # names no worker (a command of a server before ids): nothing to do
        handler = self.table.get(command.kind, self.otherwise)
        if handler is not None:
            await handler(command)


def for_executor(executor: str, workers: Table, watch: Table, ignore: Handler) -> Commands:
    """The table of an agent of this executor: a Slurm node's watches (and ``ignore`` the
    rest); any other's workers, and a WATCH to its watches as well."""
    if executor == SLURM:
        return Commands(watch, otherwise=ignore)
    watching = agent_pb2.COMMAND_KIND_WATCH
    return Commands({watching: watch[watching], **workers})
