"""The agent protocol's server side, spoken to over a real gRPC channel on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from astraeus.agent.v1 import agent_pb2, agent_pb2_grpc
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import counting
from backend.db import Database
from backend.gateway import service as agents
from backend.lifecycle import service as lifecycle
from backend.machine_identity import service as identity
from backend.machine_identity.rules import hash_token
from backend.models import (
    AgentCommand,
    Cluster,
    Gpu,
    GpuFault,
    JoinToken,
    Machine,
    MetricSample,
    Run,
    Worker,
)
from backend.secrets import service as secrets
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy, local_cluster
from tests.support.agents import agent_endpoint
from tests.support.stream import Agent, hello, one_worker_started, running_from


@pytest.fixture
async def endpoint(db: Database, clock: FakeClock, tenancy: Tenancy) -> AsyncIterator[str]:
    """The agents' endpoint (the streams' last steps done before the test's database goes)."""
    async with agent_endpoint(db, clock) as (_, address):
        yield address


async def test_a_machine_joins_receives_its_commands_and_reports_its_workers(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    agent = Agent(endpoint, machine_token)
    try:
        agent.send(hello=hello())
        welcome = await agent.receive("welcome")
        assert welcome.welcome.lease_seconds == 60
        async with db.read() as session:
            machine = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
            gpus = list(await session.scalars(select(Gpu).order_by(Gpu.index)))
        assert machine is not None and machine.state == "ready"
        assert [(g.index, g.model) for g in gpus] == [(0, "Simulated GPU"), (1, "Simulated GPU")]

        world = World(db, clock, tenancy)
        await world.submit(workers=1, gpus=2)
        await world.schedule()
        start = await agent.receive("command")
        assert start.command.kind == agent_pb2.COMMAND_KIND_START
        worker = (await world.workers("llama-sft"))[0]
        assert start.command.worker_id == worker.id  # the machine knows it by id alone
        assert start.command.start.worker == "llama-sft-0"  # its name, for people
        assert start.command.start.attempt == 1
        assert start.command.start.astraeus_environment["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert list(start.command.start.command) == ["python", "train.py"]

        agent.send(command_ack=agent_pb2.CommandAck(command_ids=[start.command.command_id]))
        for state in (agent_pb2.WORKER_STATE_READY, agent_pb2.WORKER_STATE_RUNNING):
            agent.send(
                worker_event=agent_pb2.WorkerEvent(worker_id=worker.id, attempt=1, state=state)
            )
        release = await agent.receive("command")
        assert release.command.kind == agent_pb2.COMMAND_KIND_RELEASE
        assert release.command.worker_id == worker.id
        last = agent.send(
            worker_event=agent_pb2.WorkerEvent(
                worker_id=worker.id,
                attempt=1,
                state=agent_pb2.WORKER_STATE_EXITED,
                exit_code=0,
                cause=agent_pb2.END_CAUSE_EXITED,
            )
        )
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        assert await world.status("llama-sft") == ("Completed", "1 of 1 worker completed")
        async with db.read() as session:
            acked = await session.scalar(
                select(AgentCommand.acked_at).where(AgentCommand.id == start.command.command_id)
            )
        assert acked == clock.now()
    finally:
        await agent.close()


async def test_a_failure_snapshot_reaches_the_worker(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    agent = Agent(endpoint, machine_token)
    try:
        world = World(db, clock, tenancy)
        start = await one_worker_started(agent, world)
        tail = "".join(f"line {i}\n" for i in range(50))
        last = agent.send(
            worker_event=agent_pb2.WorkerEvent(
                worker_id=start.command.worker_id,
                attempt=1,
                state=agent_pb2.WORKER_STATE_EXITED,
                exit_code=137,
                cause=agent_pb2.END_CAUSE_OOM_KILLED,
                log_tail=tail,
            )
        )
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        worker = (await world.workers("llama-sft"))[0]
        assert worker.last_failure == {
            "reason": "OOMKilled: the container exceeded its memory limit",
            "failed_at": "2026-10-01T01:02:11.402117+00:00",
            "exit_code": 137,
            "log_tail": tail,
        }
    finally:
        await agent.close()


async def test_a_wrong_token_or_no_hello_is_refused(
    endpoint: str, machine_token: str, tenancy: Tenancy
) -> None:
    for token in ("astx_" + "z" * 40, tenancy.member_token):
        agent = Agent(endpoint, token)
        agent.send(hello=hello())
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await agent.receive("welcome")
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert caught.value.details() == "The machine token is unknown or revoked."
        await agent.close()
    agent = Agent(endpoint, machine_token)
    agent.send(heartbeat=agent_pb2.Heartbeat())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.receive("welcome")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await agent.close()


@pytest.mark.parametrize("protocol", [0, 2])
async def test_an_agent_of_an_older_protocol_is_refused(
    endpoint: str, machine_token: str, db: Database, protocol: int
) -> None:
    # issue 17: an older agent would name workers by name, which repeat across workspaces;
    # issue 22: one of protocol 2 says how a worker ended in a sentence, not a cause
    agent = Agent(endpoint, machine_token)
    old = hello()
    old.protocol = protocol
    agent.send(hello=old)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.receive("welcome")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == (
        "This agent speaks an older protocol (it names workers by name, or says how they ended "
        "in sentences): upgrade it to the server's version."
    )
    await agent.close()
    async with db.read() as session:
        assert await session.scalar(select(Machine).where(Machine.name == "gpu-07")) is None


async def refusal(agent: Agent) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.receive("welcome")
    await agent.close()
    return caught.value.code(), str(caught.value.details())


async def machine_names(db: Database) -> list[str]:
    async with db.read() as session:
        return list(await session.scalars(select(Machine.name).order_by(Machine.name)))


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        (
            {"cpu_cores": float("nan")},
            "Hello refused: cpu_cores must be a number above 0 and at most 4096 (got nan).",
        ),
        (
            {"cpu_cores": float("inf")},
            "Hello refused: cpu_cores must be a number above 0 and at most 4096 (got inf).",
        ),
        (
            {"cpu_cores": -4.0},
            "Hello refused: cpu_cores must be a number above 0 and at most 4096 (got -4.0).",
        ),
        (
            {"memory_bytes": 2**50},
            "Hello refused: memory_bytes must be above 0 and at most 70368744177664 (64 TiB) "
            f"(got {2**50}).",
        ),
        (
            {"gpus": 3000},
            "Hello refused: gpus must list at most 64 GPUs (got 3000).",
        ),
        (
            {"model": "M" * 1000},
            "Hello refused: gpus[0].model must be at most 128 characters (got 1000).",
        ),
    ],
)
async def test_registration_fields_out_of_bounds_are_refused_with_a_sentence(
    endpoint: str, machine_token: str, db: Database, change: dict[str, object], sentence: str
) -> None:
    change = dict(change)  # the parameters are shared by both databases' runs
    message = hello(gpus=int(change.pop("gpus", 2)))  # type: ignore[call-overload]
    if "model" in change:
        message.gpus[0].model = str(change.pop("model"))
    for name, value in change.items():
        setattr(message, name, value)
    agent = Agent(endpoint, machine_token)
    agent.send(hello=message)
    assert await refusal(agent) == (grpc.StatusCode.INVALID_ARGUMENT, sentence)
    assert await machine_names(db) == []  # nothing was registered


async def test_a_name_that_is_empty_too_long_or_not_a_host_name_is_refused(
    endpoint: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        legacy = await access_legacy_token(session, clock, cluster)
    for name, problem in [
        ("", "machine must not be empty"),
        ("n" * 100_000, "machine must be at most 253 characters (got 100000)"),
        (
            "evil/../x",
            "machine may hold only letters, digits, '-', '.' and '_', beginning and ending with "
            "a letter or a digit",
        ),
    ]:
        agent = Agent(endpoint, legacy)
        agent.send(hello=hello(machine=name))
        assert await refusal(agent) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Hello refused: {problem}.",
        )
    assert await machine_names(db) == []


async def access_legacy_token(session: AsyncSession, clock: FakeClock, cluster: Cluster) -> str:
    """A cluster machine token as made before credentials (migration 0015 keeps them so)."""
    secret = "astx_" + "legacy" * 7
    session.add(
        JoinToken(
            token_hash=hash_token(secret),
            prefix=secret[:12],
            name="old",
            organization_id=cluster.organization_id,
            cluster_id=cluster.id,
            legacy=True,
            created_at=clock.now(),
        )
    )
    await session.flush()
    return secret


async def test_a_credential_registers_only_its_own_machine(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock
) -> None:
    agent = Agent(endpoint, machine_token)  # gpu-07's
    agent.send(hello=hello(machine="gpu-08"))
    assert await refusal(agent) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "This credential belongs to machine 'gpu-07': it cannot register as 'gpu-08'.",
    )
    # A cluster machine token from before credentials cannot pose as a machine that has one.
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        legacy = await access_legacy_token(session, clock, cluster)
    agent = Agent(endpoint, legacy)
    agent.send(hello=hello(machine="gpu-07"))
    assert await refusal(agent) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "Machine 'gpu-07' has a credential of its own: a cluster machine token cannot "
        "register as it.",
    )
    assert await machine_names(db) == []


async def test_a_join_token_joins_once_and_never_connects(
    endpoint: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        token = (
            await identity.issue_join_token(
                session, clock, organization_id=cluster.organization_id, cluster_id=cluster.id
            )
        ).secret
    agent = Agent(endpoint, token)
    agent.send(hello=hello())
    assert await refusal(agent) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "This is a join token: `astraeus agent` exchanges it for the machine's own credential; "
        "it does not connect as a machine.",
    )
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        bearer = (("authorization", f"Bearer {token}"),)
        joined = await stub.Join(agent_pb2.JoinRequest(machine="gpu-07"), metadata=bearer)
        assert joined.machine == "gpu-07" and joined.credential.startswith("astm_")
        with pytest.raises(grpc.aio.AioRpcError) as again:
            await stub.Join(agent_pb2.JoinRequest(machine="evil"), metadata=bearer)
    assert again.value.code() == grpc.StatusCode.UNAUTHENTICATED
    agent = Agent(endpoint, joined.credential)
    agent.send(hello=hello())
    await agent.receive("welcome")
    await agent.close()
    assert await machine_names(db) == ["gpu-07"]


async def test_a_forged_agents_overlong_words_are_cut_to_what_a_reason_holds(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """A machine's words longer than a reason's column (1 000 characters) once failed the
    write on PostgreSQL and the stream with it; they are cut, the stream goes on."""
    agent = Agent(endpoint, machine_token)
    try:
        world = World(db, clock, tenancy)
        start = await one_worker_started(agent, world)
        image = "registry.example.com/" + "i" * 5000
        last = agent.send(
            worker_event=agent_pb2.WorkerEvent(
                worker_id=start.command.worker_id,
                attempt=1,
                state=agent_pb2.WORKER_STATE_PULLING,
                waits_for=agent_pb2.WAIT_IMAGE,
                waits_on=image,
                detail="d" * 5000,
                reason="r" * 5000,
            )
        )
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        worker = (await world.workers("llama-sft"))[0]
        assert worker.reason == f"Pulling image {image[:400]}: {'d' * 300}"
        last = agent.send(
            worker_event=agent_pb2.WorkerEvent(
                worker_id=start.command.worker_id,
                attempt=1,
                state=agent_pb2.WORKER_STATE_EXITED,
                cause=agent_pb2.END_CAUSE_IMAGE_PULL,
                detail="e" * 5000,
                log_tail="t" * 100_000 + "\nlast line\n",
            )
        )
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        worker = (await world.workers("llama-sft"))[0]
        assert worker.state == "Failed"
        assert worker.reason == "ErrImagePull: " + "e" * 300
        assert worker.last_failure is not None
        cut = "[earlier output cut: a failure snapshot keeps the last 16 KiB]\n"
        assert worker.last_failure["log_tail"] == cut + ("t" * 100_000 + "\nlast line\n")[-16384:]
        state, reason = await world.status("llama-sft")
        assert state == "Failed" and len(reason) < 1000 and "e" * 300 in reason
    finally:
        await agent.close()


async def test_gpu_faults_are_kept_by_the_kind_their_agent_sent_a_bad_index_is_refused(
    endpoint: str, machine_token: str, db: Database
) -> None:
    agent = Agent(endpoint, machine_token)
    try:
        agent.send(hello=hello())
        await agent.receive("welcome")
        agent.send(gpu_health=agent_pb2.GpuHealth(index=4_000_000, healthy=False, reason="x"))
        # an agent before kinds were sent: its sentence says XID, the fault counts as other
        agent.send(gpu_health=agent_pb2.GpuHealth(index=0, healthy=False, reason="XID 79: old"))
        remap = agent_pb2.GpuHealth(
            index=1,
            healthy=False,
            kind=agent_pb2.GPU_FAULT_KIND_ROW_REMAP_PENDING,
            reason="Row remapping pending: the GPU must be reset",
        )
        last = agent.send(gpu_health=remap)
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        async with db.read() as session:
            health = list(await session.execute(select(Gpu.index, Gpu.health).order_by(Gpu.index)))
            faults = await session.execute(
                select(GpuFault.gpu_index, GpuFault.kind, GpuFault.reason).order_by(
                    GpuFault.gpu_index
                )
            )
        assert [tuple(h) for h in health] == [(0, "unhealthy"), (1, "unhealthy")]
        assert [tuple(f) for f in faults] == [
            (0, "other", "XID 79: old"),
            (1, "remap", "Row remapping pending: the GPU must be reset"),
        ]
    finally:
        await agent.close()


async def test_a_revoked_credential_closes_the_stream_and_the_machine_is_lost(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock
) -> None:
    agent = Agent(endpoint, machine_token)
    agent.send(hello=hello())
    await agent.receive("welcome")
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        await identity.revoke_credential(session, clock, cluster, "gpu-07")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.receive("never")
    await agent.close()
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "This machine's credential was revoked by an organisation admin.",
    )
    async with db.read() as session:
        machine = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
    assert machine is not None and machine.state == "lost"


async def test_a_command_over_the_stream_limit_fails_its_worker_and_the_next_one_arrives(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=2)
    await world.submit(name="huge", workers=1, gpus=1)
    await world.schedule()
    (huge,) = await world.workers("huge")
    async with db.transaction() as session:  # a start made before specs were bounded
        start = await session.scalar(
            select(AgentCommand).where(AgentCommand.target_worker_id == huge.id)
        )
        assert start is not None
        start.payload = {**start.payload, "environment": {"BIG": "x" * (5 * 2**20)}}
    await world.submit(name="small", workers=1, gpus=1)
    await world.schedule()
    agent = Agent(endpoint, machine_token)
    try:
        agent.send(hello=hello(gpus=2))
        command = await agent.receive("command")
        (small,) = await world.workers("small")
        assert command.command.worker_id == small.id  # the channel was not blocked
        reason = (
            "Its start command is 5.0 MiB, over the 3.9 MiB a machine's stream carries: make "
            "the spec's environment, command and mounts smaller."
        )
        deadline = asyncio.get_running_loop().time() + 10
        while (await world.workers("huge"))[0].last_failure is None:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        (failed,) = await world.workers("huge")
        assert failed.last_failure is not None and failed.last_failure["reason"] == reason
    finally:
        await agent.close()


async def test_deleting_a_run_clears_its_pending_commands(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    machine = await world.machine("gpu-07", gpus=2)
    run = await world.submit(workers=1, gpus=1)
    await world.schedule()
    async with db.transaction() as session:
        row = await session.get(Run, run.id)
        assert row is not None
        await lifecycle.delete_run(session, clock, row, "alice", ledger=counting)
    async with db.read() as session:
        pending = await agents.commands_to_send(session, machine, 0)
    assert [c.kind for c in pending] == ["delete"]  # the start never reaches the machine


async def test_secret_values_over_the_stream_limit_fail_the_worker_instead_of_the_stream(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=2)
    names = [f"s{i}" for i in range(64)]  # each at most 64 KiB: 4 MiB together
    principal = await world.principal()
    async with db.transaction() as session:
        for name in names:
            await secrets.set_secret(session, clock, principal, name, "v" * (64 * 2**10))
    run = await world.submit(workers=1, gpus=1, credentials=[{"secret": "s0", "env": "S0"}])
    await world.schedule()
    async with db.transaction() as session:
        row = await session.get(Run, run.id)
        assert row is not None  # as many credentials as a spec could once name
        row.spec = {**row.spec, "credentials": [{"secret": n, "env": n.upper()} for n in names]}
    agent = Agent(endpoint, machine_token)
    try:
        agent.send(hello=hello(gpus=2))
        start = await agent.receive("command")
        asked = agent.send(
            secret_request=agent_pb2.SecretRequest(worker_id=start.command.worker_id, attempt=1)
        )
        while (await agent.receive("ack")).ack.up_to < asked:
            pass
        (worker,) = await world.workers("llama-sft")
        assert worker.last_failure is not None
        assert worker.last_failure["reason"] == (
            "The values of its secrets are 4.0 MiB, over the 3.9 MiB a machine's stream "
            "carries: give the run fewer or smaller secrets."
        )
        last = agent.send(heartbeat=agent_pb2.Heartbeat())  # the stream goes on
        while (await agent.receive("ack")).ack.up_to < last:
            pass
    finally:
        await agent.close()


async def test_a_report_is_written_as_its_progress_and_samples_sent_apart(
    endpoint: str, machine_token: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    """Protocol 4 (issue 40): the Welcome says the server takes a Report, and a sample
    period's progress and samples in one message are written as the same messages sent apart,
    then acknowledged by the report's id."""
    agent = Agent(endpoint, machine_token)
    try:
        agent.send(hello=hello())
        assert (await agent.receive("welcome")).welcome.protocol == 4
        world = World(db, clock, tenancy)
        await world.submit(workers=1, gpus=2)
        await world.schedule()
        worker_id = await running_from(agent, await agent.receive("command"))
        at_ms = int(clock.now().timestamp() * 1000)
        samples = [
            agent_pb2.Sample(
                worker_id=worker_id,
                attempt=1,
                metric="task_gpu_utilization_ratio",
                gpu=gpu,
                at_ms=at_ms,
                value=0.75,
            )
            for gpu in (0, 1)
        ] + [
            agent_pb2.Sample(
                worker_id=worker_id,
                attempt=1,
                metric="task_cpu_usage_cores",
                at_ms=at_ms,
                value=1.5,
            )
        ]
        progress = agent_pb2.Progress(worker_id=worker_id, attempt=1, step=42, at_ms=at_ms)
        sent = agent.send(
            report=agent_pb2.Report(
                progress=[progress], metrics=agent_pb2.MetricBatch(samples=samples)
            )
        )
        while (await agent.receive("ack")).ack.up_to < sent:
            pass
        async with db.read() as session:
            worker = await session.get(Worker, worker_id)
            stored = list(
                await session.scalars(
                    select(MetricSample.value).where(MetricSample.worker_id == worker_id)
                )
            )
        assert worker is not None and worker.progress_step == 42
        assert sorted(stored) == [0.75, 0.75, 1.5]  # both GPUs' utilisation, the cores
    finally:
        await agent.close()


async def test_a_forged_agents_report_of_200_000_progress_entries_is_refused(
    endpoint: str,
    machine_token: str,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 40: a Report's progress is one entry a worker; a forged agent's 4 MiB message of
    200 000 would hold the writers' transaction for as long. It is refused, said in the log
    with the bound, acknowledged; nothing of it is written, and the stream goes on."""
    agent = Agent(endpoint, machine_token)
    try:
        world = World(db, clock, tenancy)
        worker_id = await running_from(agent, await one_worker_started(agent, world))
        at_ms = int(clock.now().timestamp() * 1000)
        flood = [
            agent_pb2.Progress(worker_id=worker_id, attempt=1, step=step, at_ms=at_ms)
            for step in range(1, 200_001)
        ]
        assert agent_pb2.Report(progress=flood).ByteSize() < 4 * 2**20
        sent = agent.send(report=agent_pb2.Report(progress=flood))
        while (await agent.receive("ack")).ack.up_to < sent:
            pass
        assert (await world.workers("llama-sft"))[0].progress_step is None
        assert "a Report of 200000 progress entries refused (at most 1024" in caplog.text
        one = agent_pb2.Progress(worker_id=worker_id, attempt=1, step=7, at_ms=at_ms)
        sent = agent.send(report=agent_pb2.Report(progress=[one]))
        while (await agent.receive("ack")).ack.up_to < sent:
            pass
        assert (await world.workers("llama-sft"))[0].progress_step == 7
    finally:
        await agent.close()


async def test_a_worker_fetching_its_code_says_so_and_how_far(  # issue 41
    endpoint: str, machine_token: str, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    agent = Agent(endpoint, machine_token)
    try:
        world = World(db, clock, tenancy)
        start = await one_worker_started(agent, world)
        last = agent.send(
            worker_event=agent_pb2.WorkerEvent(
                worker_id=start.command.worker_id,
                attempt=1,
                state=agent_pb2.WORKER_STATE_PREPARING,
                waits_for=agent_pb2.WAIT_CODE,
                waits_on="sha256:6921375a022f…",
                detail="3.0 MiB of 12.0 MiB",
            )
        )
        while (await agent.receive("ack")).ack.up_to < last:
            pass
        worker = (await world.workers("llama-sft"))[0]
        assert (worker.state, worker.waits_for) == ("Preparing", "code")
        assert worker.reason == "Fetching its code sha256:6921375a022f…: 3.0 MiB of 12.0 MiB"
    finally:
        await agent.close()
