"""A lost machine's workers keep, in their failure snapshots, the last lines the server relayed
of them (issue 36; seed L-21): the agent's own copies are gone with the machine. The replica
holding a machine's stream keeps each worker's last 50 lines it relayed (at most 16 KiB), the
lease keeper writes them every few seconds, and the loss takes them; the agent back drops
them (it has its own). Over a real gRPC stream, on SQLite and PostgreSQL, under a fake clock;
and the bounds, pure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from astraeus.agent.v1 import agent_pb2
from sqlalchemy import func, select

from backend.clock import iso_offset
from backend.db import Database
from backend.gateway.seen_lines import SEEN_BYTES, SEEN_WORKERS, SeenLines
from backend.gateway.servicer import AgentService
from backend.logs.service import WorkerRef
from backend.machines import service as machines
from backend.models import Machine, WorkerSeenLines
from tests.lifecycle.world import LEASE, World
from tests.support import SEED_TIME, FakeClock, Tenancy
from tests.support.agents import agent_endpoint
from tests.support.stream import Agent, hello, one_worker_started

LOST = "Machine lost: its lease expired"


def test_a_tail_replaces_a_follow_appends_and_each_keeps_its_last_50_lines_and_16_kib() -> None:
    seen = SeenLines()
    seen.tail(1, 7, "".join(f"old {i}\n" for i in range(80)), SEED_TIME)
    seen.tail(1, 7, "a\nb\n", SEED_TIME)  # a newer tail: the log's last lines now
    seen.follow(1, 7, "c\n", SEED_TIME + timedelta(seconds=1))
    [taken] = seen.take()
    assert (taken.machine_id, taken.worker_id, taken.text, taken.at) == (
        1,
        7,
        "a\nb\nc\n",
        SEED_TIME + timedelta(seconds=1),
    )
    assert seen.take() == []  # nothing new since

    seen.follow(1, 7, "".join(f"line {i}\n" for i in range(120)), SEED_TIME)
    [taken] = seen.take()
    assert taken.text.splitlines() == [f"line {i}" for i in range(70, 120)]
    wide = "x" * 1000 + "\n"
    seen.follow(1, 8, wide * 40, SEED_TIME)
    [taken] = seen.take()
    assert taken.text == wide * (SEEN_BYTES // len(wide))  # 16 lines of 1 001 bytes
    seen.follow(1, 9, "y" * 20_000 + "\n", SEED_TIME)  # one line over the bound: its end
    [taken] = seen.take()
    assert taken.text == "y" * (SEEN_BYTES - 1) + "\n"


def test_a_machine_keeps_the_lines_of_its_workers_relayed_last() -> None:
    seen = SeenLines()
    for worker in range(SEEN_WORKERS + 2):
        seen.follow(1, worker, f"{worker}\n", SEED_TIME)
    seen.follow(1, 2, "again\n", SEED_TIME)  # relayed again: kept, the latest
    seen.follow(1, 100, "new\n", SEED_TIME)  # one more: the oldest relayed (3) goes
    assert [s.worker_id for s in seen.take()] == [2, *range(4, SEEN_WORKERS + 2), 100]
    seen.follow(1, 3, "back\n", SEED_TIME)
    assert [s.text for s in seen.take()] == ["back\n"]  # its earlier lines were let go


def test_a_closed_streams_lines_are_let_go_once_taken_and_what_failed_is_taken_again() -> None:
    seen = SeenLines()
    seen.follow(1, 7, "a\n", SEED_TIME)
    seen.closed(1)
    first = seen.take()
    assert [s.text for s in first] == ["a\n"]
    seen.untaken(first)  # the database was away
    assert seen.take() == first
    seen.follow(1, 7, "b\n", SEED_TIME)  # after it was let go: what came since, alone
    assert [s.text for s in seen.take()] == ["b\n"]
    seen.opened(1)
    seen.follow(1, 7, "c\n", SEED_TIME)
    seen.take()
    seen.follow(1, 7, "d\n", SEED_TIME)  # its stream is held: its lines go on
    assert [s.text for s in seen.take()] == ["c\nd\n"]


@pytest.fixture
async def endpoint(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> AsyncIterator[tuple[AgentService, str]]:
    async with agent_endpoint(db, clock, lease=LEASE) as endpoint:
        yield endpoint


async def running(agent: Agent, world: World) -> WorkerRef:
    """The run's one worker, running on the agent's machine (gpu-07)."""
    start = await one_worker_started(agent, world)
    agent.send(command_ack=agent_pb2.CommandAck(command_ids=[start.command.command_id]))
    for state in (agent_pb2.WORKER_STATE_READY, agent_pb2.WORKER_STATE_RUNNING):
        last = agent.send(
            worker_event=agent_pb2.WorkerEvent(
                worker_id=start.command.worker_id, attempt=1, state=state
            )
        )
    while (await agent.receive("ack")).ack.up_to < last:
        pass
    return WorkerRef(start.command.worker_id, "llama-sft-0")


async def tail_read(service: AgentService, agent: Agent, worker: WorkerRef, text: str) -> None:
    """Someone reads the worker's log: the server asks the machine, which answers ``text``."""
    machine_id = next(iter(service.streams.by_machine))
    asked = asyncio.create_task(service.tail(machine_id, worker, 50, 1 << 20, wait_s=10))
    request = await agent.receive("log_tail")
    agent.send(reply=agent_pb2.Reply(request_id=request.id, log=agent_pb2.LogChunk(text=text)))
    answer = await asked
    assert answer is not None and answer.text == text


async def kept(db: Database) -> list[tuple[int, str]]:
    async with db.read() as session:
        rows = await session.execute(select(WorkerSeenLines.worker_id, WorkerSeenLines.text))
        return [(int(w), t) for w, t in rows]


async def test_a_lost_machines_worker_keeps_the_lines_the_server_relayed_of_it(
    endpoint: tuple[AgentService, str],
    machine_token: str,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
) -> None:
    service, address = endpoint
    world = World(db, clock, tenancy)
    agent = Agent(address, machine_token)
    try:
        worker = await running(agent, world)
        clock.advance(seconds=20)
        lines = "".join(f"step {i}\n" for i in range(60))
        await tail_read(service, agent, worker, lines)  # its last contact, too
        silent = clock.now()
        await service.leases.renew()
        last50 = "".join(f"step {i}\n" for i in range(10, 60))
        assert await kept(db) == [(worker.id, last50)]
    finally:
        await agent.close()  # the machine is gone, with its agent's copies

    clock.advance(seconds=LEASE.total_seconds() + 5)
    async with db.transaction() as session:
        await machines.expire_leases(session, clock, LEASE)
    [lost] = await world.workers("llama-sft")
    assert (lost.state, lost.last_failure) == (
        "Failed",
        {"reason": LOST, "failed_at": iso_offset(silent), "exit_code": None, "log_tail": last50},
    )
    assert await kept(db) == []  # taken into the snapshot


async def test_the_lines_seen_are_dropped_when_the_worker_ends_or_its_agent_is_back(
    endpoint: tuple[AgentService, str],
    machine_token: str,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
) -> None:
    service, address = endpoint
    world = World(db, clock, tenancy)
    agent = Agent(address, machine_token)
    try:
        worker = await running(agent, world)
        await tail_read(service, agent, worker, "step 1\n")
        await service.leases.renew()
        assert await kept(db) == [(worker.id, "step 1\n")]
        last = agent.send(
            worker_event=agent_pb2.WorkerEvent(
                worker_id=worker.id,
                attempt=1,
                state=agent_pb2.WORKER_STATE_EXITED,
                exit_code=1,
                cause=agent_pb2.END_CAUSE_EXITED,
                log_tail="step 1\nstep 2\n",
            )
        )
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        assert await kept(db) == []  # its end came with its own lines

        await world.submit(name="second", workers=1, gpus=1, restart_policy="never")
        await world.schedule()
        start = await agent.receive("command")
        second = WorkerRef(start.command.worker_id, "second-0")
        await tail_read(service, agent, second, "hello\n")
        await service.leases.renew()
        assert await kept(db) == [(second.id, "hello\n")]
    finally:
        await agent.close()

    again = Agent(address, machine_token)  # the machine's agent is back: it has its lines
    try:
        again.send(hello=hello())
        await again.receive("welcome")
        assert await kept(db) == []
        async with db.read() as session:
            assert await session.scalar(select(func.count()).select_from(Machine)) == 1
    finally:
        await again.close()
