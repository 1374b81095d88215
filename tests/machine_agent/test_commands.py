"""The agent's table of the server's commands (agent/commands.py), alone: each kind to the part
that carries it out, by the agent's executor."""

from __future__ import annotations

import pytest
from astraeus.agent.v1 import agent_pb2

from agent.commands import Commands, Handler, Table, for_executor

pytestmark = pytest.mark.unit

START, RELEASE, STOP, DELETE, WATCH = (
    agent_pb2.COMMAND_KIND_START,
    agent_pb2.COMMAND_KIND_RELEASE,
    agent_pb2.COMMAND_KIND_STOP,
    agent_pb2.COMMAND_KIND_DELETE,
    agent_pb2.COMMAND_KIND_WATCH,
)


def recording(part: str, carried: list[tuple[str, int, int]]) -> Handler:
    async def handler(command: agent_pb2.Command) -> None:
        carried.append((part, command.kind, command.worker_id))

    return handler


def tables(carried: list[tuple[str, int, int]]) -> tuple[Table, Table]:
    workers = {k: recording("workers", carried) for k in (START, RELEASE, STOP, DELETE)}
    watch = {k: recording("watch", carried) for k in (WATCH, STOP, DELETE)}
    return workers, watch


def command(kind: agent_pb2.CommandKind.ValueType, worker_id: int = 7) -> agent_pb2.Command:
    return agent_pb2.Command(command_id=1, kind=kind, worker_id=worker_id)


async def test_a_machine_running_workers_hands_them_its_commands_and_a_watch_to_its_watch() -> None:
    carried: list[tuple[str, int, int]] = []
    workers, watch = tables(carried)
    commands = for_executor("process", workers, watch, recording("ignored", carried))
    for kind in (START, RELEASE, STOP, DELETE, WATCH, agent_pb2.COMMAND_KIND_UNSPECIFIED):
        await commands.carry_out(command(kind))
    assert carried == [
        ("workers", START, 7),
        ("workers", RELEASE, 7),
        ("workers", STOP, 7),
        ("workers", DELETE, 7),
        ("watch", WATCH, 7),
    ]  # a kind it does not know: nothing


async def test_a_slurm_nodes_agent_hands_its_watch_the_slurm_commands_and_ignores_the_rest() -> (
    None
):
    carried: list[tuple[str, int, int]] = []
    workers, watch = tables(carried)
    commands = for_executor("slurm", workers, watch, recording("ignored", carried))
    for kind in (WATCH, STOP, DELETE, START, RELEASE):
        await commands.carry_out(command(kind))
    assert carried == [
        ("watch", WATCH, 7),
        ("watch", STOP, 7),  # Slurm ended it here: Slurm's to stop, never the agent's
        ("watch", DELETE, 7),
        ("ignored", START, 7),
        ("ignored", RELEASE, 7),
    ]


async def test_a_command_naming_no_worker_is_carried_out_by_none() -> None:
    carried: list[tuple[str, int, int]] = []
    commands = Commands({START: recording("workers", carried)}, recording("ignored", carried))
    await commands.carry_out(command(START, worker_id=0))  # a server's before ids
    await commands.carry_out(command(STOP, worker_id=0))
    assert carried == []
