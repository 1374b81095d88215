"""The server's side of a Slurm node's agent (issue 25), spoken to by hand over a real stream: it
joins only a Slurm-backed cluster (and such a cluster takes no other agent), it is sent what to
watch (again at each Hello) and told when Slurm ended it, and what it says of a Slurm worker is
taken as samples and progress only. A forged agent on the node cannot end, fail or lose the
workers Slurm runs; its going away loses nothing either: Slurm, not its lease, says a node is
lost."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from astraeus.agent.v1 import agent_pb2
from sqlalchemy import select

from backend.access import service as access
from backend.accounting import counting
from backend.db import Database
from backend.errors import Conflict
from backend.machine_identity import service as identity
from backend.machines import service as machines
from backend.models import AgentCommand, Cluster, Gpu, Machine, Run, Worker
from backend.runs import service as runs
from backend.slurm import service as importer
from backend.slurm.commands import SlurmSettings
from backend.slurm.rules import SlurmJob, SlurmNode
from tests.support import FakeClock, Tenancy
from tests.support.agents import agent_endpoint
from tests.support.slurm import node_credential, slurm_backed
from tests.support.stream import Agent, hello

START = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
NODE = "n1"


@pytest.fixture
async def endpoint(db: Database, clock: FakeClock, tenancy: Tenancy) -> AsyncIterator[str]:
    async with agent_endpoint(db, clock) as (_, address):
        yield address


def job(state: str, end: datetime | None = None) -> SlurmJob:
    return SlurmJob(
        job_id="301",
        name="train",
        account="physics",
        partition="gpu",
        user="ada",
        state=state,
        submit=START,
        start=START + timedelta(seconds=5),
        end=end,
        nodes=(NODE,),
        gpus=2,
        exit_code=0 if end else None,
        gpu_indexes=((0, 1),) if end is None else (),
    )


async def imported(db: Database, clock: FakeClock, *jobs: SlurmJob) -> None:
    node = SlurmNode(NODE, ("gpu",), 2, "H100", 64, 512 * 2**30, "mixed", "")
    snapshot = importer.Snapshot(read_at=clock.now(), nodes=[node], jobs=list(jobs))
    async with db.transaction() as session:
        await importer.apply(session, clock, await _hpc_id(db), snapshot)


async def _hpc_id(db: Database) -> int:
    async with db.read() as session:
        found = await session.scalar(select(Cluster.id).where(Cluster.name == "hpc"))
    assert found is not None
    return found


@pytest.fixture
async def slurm_job(db: Database, clock: FakeClock, tenancy: Tenancy) -> int:
    """Cluster hpc (Slurm's: no command is run here), its account physics mapped to workspace
    default, and job 301 running on node n1 with both its GPUs, imported: its run's id."""
    clock.moment = START + timedelta(minutes=1)
    await slurm_backed(db, clock, "hpc", SlurmSettings(conf="/nowhere"), {"physics": "default"})
    await imported(db, clock, job("RUNNING"))
    async with db.read() as session:
        run = await session.scalar(select(Run).where(Run.external_id == "301"))
    assert run is not None and run.state == "Running"
    return run.id


async def _worker(db: Database, run_id: int) -> Worker:
    async with db.read() as session:
        found = await session.scalar(select(Worker).where(Worker.run_id == run_id))
    assert found is not None
    return found


def node_hello(executor: str = "slurm") -> agent_pb2.Hello:
    message = hello(NODE)
    message.executor = executor
    return message


async def test_a_slurm_nodes_agent_is_sent_what_to_watch_and_changes_no_state(  # issue 25
    endpoint: str, db: Database, clock: FakeClock, slurm_job: int, tenancy: Tenancy
) -> None:
    worker = await _worker(db, slurm_job)
    assert (worker.gpu_ids, worker.attempt) == ([0, 1], 1)
    credential = await node_credential(db, clock, await _hpc_id(db), NODE)
    agent = Agent(endpoint, credential)
    try:
        agent.send(hello=node_hello())
        await agent.receive("welcome")
        watch = (await agent.receive("command")).command
        assert watch.kind == agent_pb2.COMMAND_KIND_WATCH and watch.worker_id == worker.id
        assert (watch.watch.worker, watch.watch.attempt) == ("train-301-0", 1)
        assert watch.watch.slurm_job_id == "301" and list(watch.watch.gpu_ids) == [0, 1]
        # an imported job: the whole job on the node, its output the worker's log
        assert not watch.watch.HasField("task") and watch.watch.batch_output
        assert watch.watch.state_dir == ""
        agent.send(command_ack=agent_pb2.CommandAck(command_ids=[watch.command_id]))

        # The node is Slurm's: the agent names its GPUs, Slurm says what the node is.
        async with db.read() as session:
            machine = await session.scalar(select(Machine).where(Machine.name == NODE))
            gpus = list(await session.scalars(select(Gpu).order_by(Gpu.index)))
        assert machine is not None
        assert (machine.executor, machine.state, machine.reason) == (
            "slurm",
            "ready",
            "Slurm: mixed",
        )
        assert [(g.uuid, g.model) for g in gpus] == [
            ("SIM-0", "Simulated GPU"),
            ("SIM-1", "Simulated GPU"),
        ]

        # What it says of the worker's state changes nothing: Slurm ends it, not the agent.
        at_ms = int((START + timedelta(seconds=30)).timestamp() * 1000)
        for state in (agent_pb2.WORKER_STATE_EXITED, agent_pb2.WORKER_STATE_READY):
            agent.send(
                worker_event=agent_pb2.WorkerEvent(
                    worker_id=worker.id, attempt=1, state=state, at_ms=at_ms, exit_code=1
                )
            )
        # Its samples and progress are taken.
        agent.send(
            metrics=agent_pb2.MetricBatch(
                samples=[
                    agent_pb2.Sample(
                        worker_id=worker.id,
                        attempt=1,
                        metric="task_gpu_utilization_ratio",
                        at_ms=at_ms,
                        value=0.9,
                        gpu=0,
                    )
                ]
            )
        )
        last = agent.send(progress=agent_pb2.Progress(worker_id=worker.id, attempt=1, step=12))
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        async with db.read() as session:
            run = await session.get(Run, slurm_job)
            after = await session.get(Worker, worker.id)
        assert run is not None and after is not None
        assert (run.state, after.state, after.exit_code) == ("Running", "Running", None)
        assert after.progress_step == 12 and after.gpu_utilization == pytest.approx(0.9)

        # A second Hello (the agent restarted, knowing nothing): the watch is sent again.
        await agent.close()
        agent = Agent(endpoint, credential)
        agent.send(hello=node_hello())
        await agent.receive("welcome")
        again = (await agent.receive("command")).command
        assert (again.kind, again.command_id) == (agent_pb2.COMMAND_KIND_WATCH, watch.command_id)
        agent.send(command_ack=agent_pb2.CommandAck(command_ids=[again.command_id]))

        # Slurm ends the job: the agent that took the watch is told so.
        clock.moment = START + timedelta(minutes=3)
        await imported(db, clock, job("COMPLETED", end=START + timedelta(minutes=2)))
        stop = (await agent.receive("command")).command
        assert (stop.kind, stop.worker_id) == (agent_pb2.COMMAND_KIND_STOP, worker.id)
        agent.send(command_ack=agent_pb2.CommandAck(command_ids=[stop.command_id]))

        # Deleting its run deletes its log on the node, as any run's.
        async with db.transaction() as session:
            member = await access.authenticate(session, tenancy.member_token)
            await runs.delete_run(session, clock, member, "train-301", ledger=counting)
        delete = (await agent.receive("command")).command
        assert (delete.kind, delete.worker_id) == (agent_pb2.COMMAND_KIND_DELETE, worker.id)
    finally:
        await agent.close()


async def test_agents_join_only_clusters_of_their_kind(  # issue 25
    endpoint: str, db: Database, clock: FakeClock, slurm_job: int, machine_token: str
) -> None:
    # an agent that runs workers on a node Slurm runs: refused, saying why
    agent = Agent(endpoint, await node_credential(db, clock, await _hpc_id(db), NODE))
    try:
        agent.send(hello=node_hello("process"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await agent.receive("welcome")
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details() == (
            "Cluster hpc is run by Slurm: the agent on each of its nodes watches the jobs Slurm "
            "runs there and runs none of its own (astraeus agent --executor slurm)"
        )
    finally:
        await agent.close()
    # an agent that only watches, on a cluster Astraeus schedules: refused too
    local = Agent(endpoint, machine_token)
    try:
        local.send(hello=_slurm_hello_as("gpu-07"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await local.receive("welcome")
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "is scheduled by Astraeus" in (refused.value.details() or "")
    finally:
        await local.close()
    async with db.read() as session:
        gpu07 = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
    assert gpu07 is None  # nothing registered


def _slurm_hello_as(machine: str) -> agent_pb2.Hello:
    message = hello(machine)
    message.executor = "slurm"
    return message


async def test_a_slurm_node_whose_agent_went_away_loses_no_worker(  # issue 25
    endpoint: str, db: Database, clock: FakeClock, slurm_job: int, tenancy: Tenancy
) -> None:
    hpc = await _hpc_id(db)
    agent = Agent(endpoint, await node_credential(db, clock, hpc, NODE))
    agent.send(hello=node_hello())
    await agent.receive("welcome")
    await agent.close()
    clock.advance(minutes=10)  # ten leases without a word
    async with db.transaction() as session:
        await machines.expire_leases(session, clock, timedelta(seconds=60))
        await machines.expire_leases(session, clock, timedelta(seconds=60))
    # nor is anything lost when its credential is revoked (a node's agent reinstalled)
    async with db.transaction() as session:
        cluster = await session.get(Cluster, hpc)
        assert cluster is not None
        await identity.revoke_credential(session, clock, cluster, NODE)
    async with db.read() as session:
        run = await session.get(Run, slurm_job)
        machine = await session.scalar(select(Machine).where(Machine.name == NODE))
    assert run is not None and machine is not None
    assert (run.state, run.reason, machine.state) == ("Running", "1 of 1 worker running", "ready")
    # nor is it drained here: Slurm places work on it
    async with db.transaction() as session:
        admin = await access.authenticate(session, tenancy.admin_token)
        with pytest.raises(Conflict) as refused:
            await machines.drain_by_name(session, clock, admin, "hpc", NODE)
    assert refused.value.code == "MACHINE_RUN_BY_SLURM"
    async with db.read() as session:
        commands = list(await session.scalars(select(AgentCommand.kind)))
    assert commands == ["watch"]  # nothing was stopped


async def test_a_failed_slurm_jobs_lines_come_from_the_node_it_ran_on_once(  # issue 25
    endpoint: str, db: Database, clock: FakeClock, slurm_job: int
) -> None:
    hpc = await _hpc_id(db)
    worker = await _worker(db, slurm_job)
    clock.moment = START + timedelta(minutes=3)
    failed = job("FAILED", end=START + timedelta(minutes=2))
    await imported(db, clock, dataclasses.replace(failed, exit_code=3))
    async with db.read() as session:
        before = await session.get(Worker, worker.id)
    assert before is not None and before.last_failure is not None
    assert (before.state, before.last_failure["log_tail"]) == ("Failed", "")

    credentials = {n: await node_credential(db, clock, hpc, n) for n in (NODE, "n2")}

    async def says(node: str, lines: str) -> None:
        agent = Agent(endpoint, credentials[node])
        try:
            agent.send(hello=_slurm_hello_as(node))
            await agent.receive("welcome")
            event = agent_pb2.WorkerEvent(
                worker_id=worker.id, state=agent_pb2.WORKER_STATE_EXITED, log_tail=lines
            )
            sent = agent.send(worker_event=event)
            while (await agent.receive("ack")).ack.up_to < sent:
                pass
        finally:
            await agent.close()

    await says("n2", "forged by another node\n")  # it never ran there
    await says(NODE, "epoch 3\nTraceback: CUDA error\n")
    await says(NODE, "said again, later\n")  # once filled, kept
    async with db.read() as session:
        after = await session.get(Worker, worker.id)
    assert after is not None and after.last_failure is not None
    assert after.last_failure["log_tail"] == "epoch 3\nTraceback: CUDA error\n"
    assert (after.state, after.last_failure["exit_code"]) == ("Failed", 3)
