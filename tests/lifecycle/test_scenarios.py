"""A scenario per reason sentence of the seeds' two tables: exact sentences, history and times."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from backend.accounting import counting
from backend.db import Database
from backend.gateway import service as agents
from backend.lifecycle import service as lifecycle
from backend.lifecycle.progress import is_straggler
from backend.lifecycle.sentences import EndCause
from backend.lifecycle.states import Wait
from backend.machines import service as machines
from backend.machines.rules import FaultKind
from backend.metrics.rules import SampleIn
from backend.models import Gpu, Machine
from backend.runs.rules import task_counts
from tests.lifecycle.world import LEASE, World
from tests.support import SEED_TIME, local_cluster
from tests.support.lifecycle import running_gang

T0 = SEED_TIME


async def test_a_gang_starts_together_and_runs(world: World) -> None:
    # seed L-45: the history rows of a run that started; L-29: the worker reasons
    await running_gang(world)
    assert await world.history("llama-sft") == [
        (T0, "Pending", "Run created"),
        (T0 + timedelta(seconds=1), "Starting", "Starting together: 0 of 2 ready"),
        (T0 + timedelta(seconds=2), "Running", "2 of 2 workers running"),
    ]
    workers = await world.workers("llama-sft")
    assert [(w.name, w.state, w.reason, w.gpu_ids) for w in workers] == [
        ("llama-sft-0", "Running", "Container running", list(range(8))),
        ("llama-sft-1", "Running", "Container running", list(range(8))),
    ]
    assert await world.commands("gpu-07") == [("start", "llama-sft-0"), ("release", "llama-sft-0")]
    assert await world.phases("llama-sft-0") == [
        (T0, "Pending", "waiting", 0),
        (T0 + timedelta(seconds=1), "Starting", "starting", 8),
        (T0 + timedelta(seconds=2), "Running", "running", 8),
    ]


async def test_the_start_command_carries_what_torchrun_expects(world: World, db: Database) -> None:
    from backend.models import AgentCommand

    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(gpus=8, environment={"NCCL_DEBUG": "WARN"})
    await world.schedule()
    async with db.read() as session:
        starts = list(await session.scalars(select(AgentCommand).order_by(AgentCommand.id)))
    env = [c.payload["astraeus_environment"] for c in starts]
    assert env[1] == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "gpu-07",
        "MASTER_PORT": "29500",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "ASTRAEUS_RUN": "llama-sft",
        "ASTRAEUS_WORKER": "llama-sft-1",
    }
    assert starts[0].payload["environment"] == {"NCCL_DEBUG": "WARN"}
    assert starts[0].payload["memory_limit_bytes"] == 16 * 2**30


async def test_a_failed_worker_fails_the_gang_with_the_seeds_sentence(world: World) -> None:
    # seed L-48, L-50, L-21, L-22: the run's reason names the worker, the machine and why
    await running_gang(world, restart_policy="never")
    world.clock.advance(seconds=10)
    await world.report("llama-sft-1", "exited", exit_code=1, log_tail="Traceback …\n")
    sentence = (
        "Worker llama-sft-1 failed on gpu-08: Exited with code 1; the gang does not run without it"
    )
    assert await world.status("llama-sft") == ("Running", sentence)
    survivor, failed = await world.workers("llama-sft")
    assert (survivor.state, survivor.reason) == ("Stopping", "Stopping: worker llama-sft-1 failed")
    counts = task_counts([survivor.state, failed.state])
    assert (counts["Stopping"], counts["Failed"], sum(counts.values())) == (1, 1, 2)
    world.clock.advance(seconds=2)
    await world.report("llama-sft-0", "exited", exit_code=143)
    assert await world.status("llama-sft") == ("Failed", sentence)
    failed = (await world.workers("llama-sft"))[1]
    assert failed.last_failure == {
        "reason": "Exited with code 1",
        "failed_at": "2026-10-01T01:02:23.402117+00:00",
        "exit_code": 1,
        "log_tail": "Traceback …\n",
    }
    assert (failed.state, failed.exit_code) == ("Failed", 1)
    assert [p[2] for p in await world.phases("llama-sft-0")][-2:] == ["stopping:failure", "ended"]


async def test_a_failure_snapshot_keeps_16_kib_whatever_the_machine_sends(world: World) -> None:
    # issue 18: the agent sends at most 16 KiB; a machine that sends 3 MiB is cut, with a marker
    await running_gang(world, restart_policy="never")
    await world.report("llama-sft-1", "exited", exit_code=1, log_tail="a" * 3 * 2**20 + "end\n")
    failed = (await world.workers("llama-sft"))[1]
    assert failed.last_failure["log_tail"] == (
        "[earlier output cut: a failure snapshot keeps the last 16 KiB]\n"
        + "a" * (16 * 1024 - 4)
        + "end\n"
    )


@pytest.mark.parametrize(
    ("exit_code", "cause", "detail", "expected"),
    [
        (127, EndCause.NOT_FOUND, "", "Exited with code 127"),  # seed L-51
        (137, EndCause.SIGNALLED, "", "Exited with code 137"),
        (
            137,
            EndCause.OOM_KILLED,
            "",
            "OOMKilled: the container exceeded its memory limit",
        ),  # seed L-52
        (
            None,
            EndCause.IMAGE_PULL,
            "pull access denied for llama:latest",
            "ErrImagePull: pull access denied for llama:latest",
        ),  # seed L-53
        (None, EndCause.LOST, "", "Lost: its process ended while the agent was away"),
    ],
)
async def test_the_agents_cause_is_the_workers_sentence_and_names_the_run(
    world: World, exit_code: int | None, cause: EndCause, detail: str, expected: str
) -> None:
    """The agent says how the worker ended (a cause, its details); the server writes the
    sentence, the worker's and in the run's."""
    await running_gang(world, restart_policy="never", workers=1)
    await world.report("llama-sft-0", "exited", exit_code=exit_code, cause=cause, detail=detail)
    assert await world.status("llama-sft") == (
        "Failed",
        f"Worker llama-sft-0 failed on gpu-07: {expected}; the gang does not run without it",
    )
    worker = (await world.workers("llama-sft"))[0]
    assert (worker.state, worker.reason, worker.exit_code) == ("Failed", expected, exit_code)
    assert ((await world.run("llama-sft")).cause, worker.cause) == (cause, cause)


async def test_each_failure_doubles_the_wait_until_the_budget_is_spent(world: World) -> None:
    # seed L-56, L-69: 10 s, 20 s, … up to 5 minutes; after 10 restarts in a row it gives up
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=1)
    waits = []
    attempts = 0
    for _ in range(11):
        attempts += 1
        await world.schedule()
        await world.start("llama-sft-0")
        world.clock.advance(seconds=30)
        await world.report("llama-sft-0", "exited", exit_code=1)
        run = await world.run("llama-sft")
        if run.state == "Failed":
            break
        assert run.restart_at is not None
        waits.append(int((run.restart_at - world.clock.now()).total_seconds()))
        assert run.reason.startswith("Restarting in ")
        # Not placed again before its wait is over.
        assert (await world.schedule()).placed == []
        world.clock.moment = run.restart_at
    assert waits == [10, 20, 40, 80, 160, 300, 300, 300, 300, 300]
    assert await world.status("llama-sft") == (
        "Failed",
        "Retry budget exhausted after 10/10 restarts",
    )
    assert (await world.workers("llama-sft"))[0].restarts == 10
    assert attempts == 11


async def test_ten_minutes_running_resets_the_count(world: World) -> None:
    # seed L-69
    await world.machine("gpu-07")
    await world.submit(workers=1, gpus=1, max_restarts=1)
    await world.schedule()
    await world.start("llama-sft-0")
    await world.report("llama-sft-0", "exited", exit_code=1)
    assert (await world.run("llama-sft")).reason == (
        "Restarting in 10s (1/1): Worker llama-sft-0 failed on gpu-07: Exited with code 1; "
        "the gang does not run without it"
    )
    world.clock.advance(seconds=10)
    await world.schedule()
    await world.start("llama-sft-0")
    world.clock.advance(minutes=10)
    await world.report("llama-sft-0", "exited", exit_code=1)
    run = await world.run("llama-sft")
    assert (run.state, run.failures_in_row) == ("Pending", 1)
    assert run.reason.startswith("Restarting in 10s (1/1)")


async def test_the_time_limit_winds_the_run_down(world: World) -> None:
    # seed L-54: "Exceeded its time limit of 12h"; the wind-down is productive (G-4)
    await running_gang(world, time_limit="12h", workers=1)
    world.clock.advance(hours=11, minutes=59)
    await world.timers()
    assert (await world.run("llama-sft")).state == "Running"
    world.clock.advance(minutes=1)
    await world.timers()
    assert (await world.commands("gpu-07"))[-1] == ("stop", "llama-sft-0")
    worker = (await world.workers("llama-sft"))[0]
    assert (worker.state, worker.phase) == ("Stopping", "stopping:time_limit")
    world.clock.advance(seconds=5)
    await world.report("llama-sft-0", "exited", exit_code=143)
    assert await world.status("llama-sft") == ("Failed", "Exceeded its time limit of 12h")


async def test_a_lost_machine_fails_its_workers_and_they_restart(world: World) -> None:
    # seed L-55: "Machine lost: its lease expired"; restarted under its policy
    await running_gang(world)
    world.clock.advance(seconds=LEASE.total_seconds() + 1)
    async with world.db.transaction() as session:
        gpu08 = await session.scalar(select(Machine).where(Machine.name == "gpu-08"))
        assert gpu08 is not None
        await machines.heartbeat(session, world.clock, gpu08.id, LEASE)
        await machines.expire_leases(session, world.clock, LEASE)
    lost, survivor = await world.workers("llama-sft")
    assert (lost.state, lost.reason) == ("Failed", "Machine lost: its lease expired")
    assert lost.last_failure["reason"] == "Machine lost: its lease expired"
    assert (survivor.state, survivor.reason) == ("Stopping", "Stopping: worker llama-sft-0 failed")
    world.clock.advance(seconds=2)
    await world.report("llama-sft-1", "exited", exit_code=143)
    assert await world.status("llama-sft") == (
        "Pending",
        "Restarting in 10s (1/10): Worker llama-sft-0 failed on gpu-07: Machine lost: its lease "
        "expired; the gang does not run without it",
    )
    phases = [p[1:3] for p in await world.phases("llama-sft-1")]
    assert phases[-3:] == [
        ("Stopping", "stopping:failure"),
        ("Stopped", "requeued:failure"),
        ("Pending", "requeued:failure"),
    ]


async def expire_leases(world: World) -> None:
    async with world.db.transaction() as session:
        await machines.expire_leases(session, world.clock, LEASE)


async def machine_states(world: World) -> dict[str, str]:
    async with world.db.read() as session:
        return {m.name: m.state for m in await session.scalars(select(Machine))}


async def test_leases_do_not_expire_over_a_database_outage(world: World) -> None:
    # issue 9: while the database is away no heartbeat is written and no lease is checked; the
    # first check after it finds the one before it long past and gives every machine a whole
    # lease, so a database restart longer than a lease does not fail every running worker
    await running_gang(world)
    await expire_leases(world)
    world.clock.advance(seconds=LEASE.total_seconds() / 2)
    await expire_leases(world)  # half a lease since the last check: an ordinary pass
    world.clock.advance(seconds=LEASE.total_seconds() + 30)  # the outage
    await expire_leases(world)
    assert await machine_states(world) == {"gpu-07": "ready", "gpu-08": "ready"}
    assert await world.status("llama-sft") == ("Running", "2 of 2 workers running")
    # gpu-07's agent is heard from again; gpu-08's never is: lost one lease after the outage
    async with world.db.transaction() as session:
        gpu07 = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
        assert gpu07 is not None
        for _ in range(4):
            world.clock.advance(seconds=20)
            await machines.heartbeat(session, world.clock, gpu07.id, LEASE)
            await machines.expire_leases(session, world.clock, LEASE)
    assert await machine_states(world) == {"gpu-07": "ready", "gpu-08": "lost"}


async def test_a_lease_check_half_a_lease_after_the_last_takes_machines_for_lost(
    world: World,
) -> None:
    # the grace is for a gap over half a lease only: checks at that pace still find the dead
    await running_gang(world)
    for _ in range(3):
        await expire_leases(world)
        world.clock.advance(seconds=LEASE.total_seconds() / 2)
    await expire_leases(world)
    assert await machine_states(world) == {"gpu-07": "lost", "gpu-08": "lost"}


async def test_preemption_queues_the_lower_priority_run_again(world: World) -> None:
    # seed L-57: "Preempted by higher-priority work (…)": not a failure, queued again
    await world.machine("gpu-07")
    await world.submit(name="sweep-7", workers=1, gpus=8, priority=10)
    await world.schedule()
    await world.start("sweep-7-0")
    world.clock.advance(minutes=5)
    await world.submit(name="llm", workers=1, gpus=8, priority=90)
    result = await world.schedule()
    assert result.preempted == ["sweep-7"]
    assert result.reasons["llm"] == "Next to run: waiting for sweep-7 to stop"
    assert await world.status("sweep-7") == ("Running", "Preempted by higher-priority work (llm)")
    world.clock.advance(seconds=3)
    await world.report("sweep-7-0", "exited", exit_code=143)
    assert await world.status("sweep-7") == ("Pending", "Preempted by higher-priority work (llm)")
    assert [p[1:3] for p in await world.phases("sweep-7-0")][-4:] == [
        ("Running", "running"),
        ("Stopping", "stopping:preemption"),
        ("Stopped", "requeued:preemption"),
        ("Pending", "requeued:preemption"),
    ]
    result = await world.schedule()
    assert result.placed == ["llm"]
    assert result.reasons["sweep-7"] == (
        "No machine fits: none has room now for a worker of 8 GPUs, 4 cores, 16 GiB"
        " (GPUs short on gpu-07)"
    )
    assert (await world.run("sweep-7")).failures_in_row == 0


async def test_a_gang_at_its_barrier_for_15_minutes_is_requeued(world: World) -> None:
    # seed L-67
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(gpus=8)
    await world.schedule()
    await world.report("llama-sft-0", "ready")
    await world.report("llama-sft-1", "Pulling", waits=(Wait.IMAGE, "nvcr.io/nvidia/pytorch:24.05"))
    assert await world.status("llama-sft") == (
        "Pulling",
        "Pulling image nvcr.io/nvidia/pytorch:24.05",
    )
    assert (await world.run("llama-sft")).waits_for == "image"
    world.clock.advance(minutes=15)
    await world.timers()
    sentence = "Gang requeued: 1 of 2 ready after 15m at the barrier"
    assert (await world.run("llama-sft")).reason == sentence
    for w in ("llama-sft-0", "llama-sft-1"):
        await world.report(w, "exited", exit_code=143)
    assert await world.status("llama-sft") == ("Pending", sentence)
    assert [p[1:3] for p in await world.phases("llama-sft-0")][-3:] == [
        ("Stopping", "stopping:failure"),
        ("Stopped", "requeued:failure"),
        ("Pending", "requeued:failure"),
    ]


async def test_pending_reasons_say_why_a_run_does_not_start(world: World) -> None:
    # seed L-61, L-62, L-63
    result = await world.schedule()
    await world.submit(name="early", workers=1, gpus=1)
    result = await world.schedule()
    assert result.reasons["early"] == "No machine fits: local has no ready machine"
    await world.machine("gpu-07", gpus=8)
    await world.machine("gpu-08", gpus=8)
    await world.submit(name="huge", workers=1, gpus=16)
    await world.submit(name="wider", workers=3, gpus=8)
    await world.submit(name="wide", workers=2, gpus=8)
    # both machines could take it: it waits behind "wide" (issue 36: a run that fits on a
    # machine "wide" could never use is placed there)
    await world.submit(name="small", workers=1, gpus=6)
    result = await world.schedule()
    assert result.placed == ["early"]  # one GPU of one machine: "wide" fits on one only
    assert result.reasons["huge"] == (
        "Cannot plan workers: no machine in the cluster has room for one worker of 16 GPUs, "
        "4 cores, 16 GiB (the largest, gpu-07, has 8 GPUs, 64 cores, 512 GiB)"
    )
    # issue 36: a gang the machines could never hold whole is not waiting for room
    assert result.reasons["wider"] == (
        "Cannot plan workers: 3 workers of 8 GPUs, 4 cores, 16 GiB do not fit in the cluster: "
        "with nothing else on them, its machines have room for 2"
    )
    assert result.reasons["wide"] == (
        "Gang cannot be placed whole: room for 1 of 2 workers of 8 GPUs, 4 cores, 16 GiB"
    )
    assert result.reasons["small"] == "Queued behind wide"
    assert (await world.run("small")).reason == "Queued behind wide"
    assert [h[1:] for h in await world.history("small")] == [("Pending", "Run created")]


async def test_a_namespace_quota_holds_a_run_back(world: World, db: Database) -> None:
    # seed L-62: "Waits for namespace quota: …"
    from backend.models import Workspace, WorkspaceQuota

    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        ws = await session.scalar(select(Workspace).where(Workspace.name == "default"))
        assert cluster and ws
        session.add(WorkspaceQuota(workspace_id=ws.id, cluster_id=cluster.id, gpus=8))
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(name="first", workers=1, gpus=6)
    await world.submit(name="second", workers=1, gpus=4)
    await world.submit(name="too-big", workers=2, gpus=8)
    result = await world.schedule()
    assert result.placed == ["first"]
    assert result.reasons["second"] == (
        "Waits for namespace quota: default holds 6 of 8 GPUs on local; this run asks for 4"
    )
    assert result.reasons["too-big"] == (
        "Cannot plan workers: 2 workers of 8 GPUs are more than default's quota of 8 GPUs on local"
    )


async def test_its_owner_stops_it(world: World) -> None:
    await running_gang(world, workers=1)
    world.clock.advance(minutes=1)
    async with world.db.transaction() as session:
        await lifecycle.stop_run(session, world.clock, await world.run("llama-sft"), "alice")
    worker = (await world.workers("llama-sft"))[0]
    assert (worker.state, worker.reason, worker.phase) == (
        "Stopping",
        "Stopping: asked by alice",
        "stopping:owner",
    )
    await world.report("llama-sft-0", "exited", exit_code=143)
    assert await world.status("llama-sft") == ("Stopped", "Stopped by alice")


async def test_a_stall_counts_from_the_last_progress_and_restarts_the_gang(world: World) -> None:
    # seed G-6, G-7: stalled from when it stopped making progress
    await running_gang(world, workers=1, stall_timeout="30m")
    world.clock.advance(minutes=5)
    await world.report("llama-sft-0", "progress")
    last_progress = world.clock.now()
    world.clock.advance(minutes=29)
    await world.timers()
    assert (await world.run("llama-sft")).state == "Running"
    world.clock.advance(minutes=1)
    await world.timers()
    phases = await world.phases("llama-sft-0")
    assert phases[-2:] == [
        (last_progress, "Running", "stalled", 8),
        (world.clock.now(), "Stopping", "stopping:stall", 8),
    ]
    assert (await world.run("llama-sft")).reason == (
        "Worker llama-sft-0 stalled on gpu-07: no progress for 30m"
    )
    await world.report("llama-sft-0", "exited", exit_code=143)
    run = await world.run("llama-sft")
    assert run.state == "Pending" and run.reason.startswith("Restarting in 10s (1/10): Worker")


async def test_a_drain_preempts_the_machines_runs(world: World) -> None:
    await running_gang(world, workers=1)
    async with world.db.transaction() as session:
        gpu07 = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
        assert gpu07 is not None
        await machines.drain(session, world.clock, gpu07)
    assert await world.status("llama-sft") == ("Running", "Preempted by a drain of gpu-07")
    stopping = (await world.workers("llama-sft"))[0]
    assert (stopping.state, stopping.stop_cause) == ("Stopping", "drain")  # typed, not parsed
    assert (await world.run("llama-sft")).stop_by == "gpu-07"
    assert (await world.phases("llama-sft-0"))[-1][2] == "stopping:preemption"
    await world.report("llama-sft-0", "exited", exit_code=143)
    assert await world.status("llama-sft") == ("Pending", "Preempted by a drain of gpu-07")
    drained = (await world.workers("llama-sft"))[0]
    assert drained.last_failure["reason"] == "Preempted by a drain of gpu-07"
    assert (await world.schedule()).placed == ["llama-sft"]
    assert (await world.workers("llama-sft"))[0].reason == "Placed on gpu-08; starting"


async def test_a_gpu_fault_fails_its_worker_and_keeps_the_gpu_out(world: World) -> None:
    await world.machine("gpu-07", gpus=2)
    await world.submit(workers=1, gpus=1)
    await world.schedule()
    await world.start("llama-sft-0")
    async with world.db.transaction() as session:
        gpu07 = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
        assert gpu07 is not None
        await machines.gpu_fault(
            session, world.clock, gpu07, 0, "XID 79: GPU has fallen off the bus", kind=FaultKind.XID
        )
    worker = (await world.workers("llama-sft"))[0]
    assert worker.last_failure["reason"] == (
        "GPU fault on gpu-07/0: XID 79: GPU has fallen off the bus"
    )
    world.clock.advance(seconds=10)
    assert (await world.schedule()).placed == ["llama-sft"]
    assert (await world.workers("llama-sft"))[0].gpu_ids == [1]
    async with world.db.read() as session:
        health = list(await session.execute(select(Gpu.index, Gpu.health).order_by(Gpu.index)))
    assert [tuple(h) for h in health] == [(0, "unhealthy"), (1, "ok")]


async def test_the_first_failure_is_the_earliest_exit_not_the_first_report(world: World) -> None:
    # seed L-59: the run's reason names the first worker that failed
    await running_gang(world, restart_policy="never")
    world.clock.advance(seconds=20)
    crash = world.clock.now() - timedelta(seconds=5)
    await world.report("llama-sft-1", "exited", exit_code=1)  # Connection closed by peer
    # CUDA error: an illegal memory access was encountered
    await world.report("llama-sft-0", "exited", exit_code=134, cause=EndCause.SIGNALLED, at=crash)
    assert await world.status("llama-sft") == (
        "Failed",
        "Worker llama-sft-0 failed on gpu-07: Exited with code 134; the gang does not run "
        "without it",
    )


GLOO_PEER_GONE = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
    "peer [127.0.0.1]:29500\n"
)


@pytest.mark.parametrize("order", ["heard of first", "crashed first"])
async def test_the_rank_that_crashed_is_named_not_the_rank_that_heard_its_peer_go(
    world: World, order: str
) -> None:
    # seed L-59; CI: rank 1 exited with code 3, rank 0 heard gloo's "Connection closed by peer"
    # and aborted (134) 0.4 s before rank 1's process was gone: rank 0 was named
    await running_gang(world, restart_policy="never")
    world.clock.advance(seconds=20)
    crashed = world.clock.now() - timedelta(seconds=1)
    heard = crashed - timedelta(seconds=0.4)
    reports = [
        (
            "llama-sft-0",
            {
                "exit_code": 134,
                "cause": EndCause.SIGNALLED,
                "at": heard,
                "log_tail": "rank 0 step 4\n" + GLOO_PEER_GONE,
            },
        ),
        ("llama-sft-1", {"exit_code": 3, "at": crashed, "log_tail": "rank 1: giving up\n"}),
    ]
    for worker, fields in reports if order == "heard of first" else reversed(reports):
        await world.report(worker, "exited", **fields)
    assert await world.status("llama-sft") == (
        "Failed",
        "Worker llama-sft-1 failed on gpu-08: Exited with code 3; the gang does not run without it",
    )


async def test_a_peer_lost_failure_well_before_another_is_still_the_first(world: World) -> None:
    # the grace is seconds: a rank that lost its network long before the others failed is named
    await running_gang(world, restart_policy="never")
    world.clock.advance(seconds=30)
    early = world.clock.now() - timedelta(seconds=20)
    await world.report("llama-sft-1", "exited", exit_code=1, log_tail="rank 1\n")
    await world.report("llama-sft-0", "exited", exit_code=1, at=early, log_tail=GLOO_PEER_GONE)
    assert (await world.status("llama-sft"))[1].startswith("Worker llama-sft-0 failed")


async def test_a_restart_that_never_started_names_the_rank_refused_not_the_one_it_stopped(
    world: World,
) -> None:
    # seed L-59 (issue 36, found by a fresh clone's CI): a restart's rank 0 refused its
    # MASTER_PORT at the barrier, and rank 1, asked to stop, ended "Stopped before it started".
    # The refusal's lines were the first attempt's (rank 0 had died of its lost peer then): it
    # was counted 5 s late, after rank 1's end, and rank 1 was named
    await running_gang(world, restart_policy="on_failure")
    world.clock.advance(seconds=30)
    await world.report("llama-sft-1", "exited", exit_code=4, log_tail="rank 1\n")
    await world.report("llama-sft-0", "exited", exit_code=1, log_tail=GLOO_PEER_GONE)
    world.clock.advance(seconds=15)
    await world.timers()
    await world.schedule()
    await world.report("llama-sft-1", "ready")
    world.clock.advance(seconds=1)
    refused = (
        "MASTER_PORT 25404 is in use on gpu-07 by another program (the next start takes another)"
    )
    await world.report(
        "llama-sft-0", "exited", cause=EndCause.NOT_STARTED, detail=refused, log_tail=GLOO_PEER_GONE
    )
    world.clock.advance(seconds=1)
    await world.report("llama-sft-1", "exited", cause=EndCause.STOPPED_BEFORE_START)
    assert (await world.history("llama-sft"))[-1][1:] == (
        "Pending",
        f"Restarting in 20s (2/10): Worker llama-sft-0 failed on gpu-07: {refused}; the gang "
        "does not run without it",
    )
    workers = await world.workers("llama-sft")
    assert [(w.name, w.restarts) for w in workers] == [("llama-sft-0", 2), ("llama-sft-1", 2)]
    ended = [[p[1:3] for p in await world.phases(w.name)][-2] for w in workers]
    assert ended == [("Failed", "requeued:failure"), ("Stopped", "requeued:failure")]


async def test_deleting_a_run_removes_its_workers_and_their_logs(world: World) -> None:
    # seed L-23
    await running_gang(world)
    async with world.db.transaction() as session:
        await lifecycle.delete_run(
            session, world.clock, await world.run("llama-sft"), "alice", ledger=counting
        )
    assert await world.status("llama-sft") == ("Deleted", "Deleted by alice")
    assert await world.workers("llama-sft") == []
    assert (await world.commands("gpu-08"))[-2:] == [
        ("delete", "llama-sft-0"),
        ("delete", "llama-sft-1"),
    ]
    assert (await world.run("llama-sft")).deleted_at == world.clock.now()


async def test_a_gang_member_well_behind_its_gangs_pace_becomes_a_straggler(world: World) -> None:
    await running_gang(world, workers=3, gpus=2)
    paces = {0: 100, 1: 100, 2: 20}  # steps a minute
    flags = []
    for minute in range(1, 6):
        world.clock.advance(minutes=1)
        for rank, pace in paces.items():
            await world.report(f"llama-sft-{rank}", "progress", step=minute * pace)
        await world.timers()
        workers = await world.workers("llama-sft")
        flags.append([is_straggler(w, world.clock.now()) for w in workers])
    # Paces are known from the second report on; three minutes behind makes a straggler.
    assert flags == [[False] * 3] * 4 + [[False, False, True]]
    world.clock.advance(minutes=1)
    for rank in paces:
        await world.report(f"llama-sft-{rank}", "progress", step=1000 if rank == 2 else 600)
    await world.timers()
    assert [w.slow_since for w in await world.workers("llama-sft")] == [None, None, None]


async def test_without_progress_reports_a_stragglers_pace_is_its_gpu_utilisation(
    world: World,
) -> None:
    # DESIGN §3: "progress rate (or, without progress reports, GPU utilisation)"
    await running_gang(world, workers=3, gpus=2)
    busy = {0: 0.92, 1: 0.88, 2: 0.21}
    flags = []
    for _ in range(5):
        world.clock.advance(minutes=1)
        for w in await world.workers("llama-sft"):
            assert w.machine_id is not None
            samples = [
                SampleIn(w.id, "task_gpu_utilization_ratio", gpu, 0, busy[w.rank])
                for gpu in w.gpu_ids
            ]
            async with world.db.transaction() as session:
                await agents.metrics(session, w.machine_id, samples)
        await world.timers()
        flags.append([is_straggler(w, world.clock.now()) for w in await world.workers("llama-sft")])
    assert flags == [[False] * 3] * 3 + [[False, False, True]] * 2
    assert [round(w.gpu_utilization or 0, 2) for w in await world.workers("llama-sft")] == [
        0.92,
        0.88,
        0.21,
    ]


async def test_what_a_worker_waits_for_is_reported_by_kind_and_said_by_the_server(
    world: World,
) -> None:
    # seed L-64, L-65, "Pulling for a long time": the agent names what it waits for; the
    # sentence is the server's, and the kind is kept beside it for the advice (issue 22)
    await world.machine("gpu-07")
    await world.submit(workers=1)
    await world.schedule()
    waits = [
        ((Wait.SECRET, "hf-token"), "", "waiting for external secret hf-token"),
        ((Wait.DRIVE, "datasets"), "", "Waiting for drive datasets to be filled"),
        ((Wait.IMAGE, "ghcr.io/a/t:v9"), "", "Pulling image ghcr.io/a/t:v9"),
        (
            (Wait.IMAGE, "ghcr.io/a/t:v9"),
            "2.1 GB of 3.4 GB",
            "Pulling image ghcr.io/a/t:v9: 2.1 GB of 3.4 GB",
        ),
    ]
    for wait, done, sentence in waits:
        kind = "Pulling" if wait[0] == Wait.IMAGE else "Preparing"
        await world.report("llama-sft-0", kind, waits=wait, detail=done)
        [worker] = await world.workers("llama-sft")
        run = await world.run("llama-sft")
        assert (worker.reason, worker.waits_for) == (sentence, wait[0])
        assert (run.state, run.reason, run.waits_for) == (kind, sentence, wait[0])
    # once ready and running, nothing is waited for
    await world.start("llama-sft-0")
    [worker] = await world.workers("llama-sft")
    run = await world.run("llama-sft")
    assert (run.state, run.waits_for, worker.waits_for) == ("Running", None, None)


async def test_the_scheduler_keeps_what_a_pending_run_waits_for_beside_its_reason(
    world: World,
) -> None:
    await world.submit(workers=2, gpus=8)
    await world.schedule()
    run = await world.run("llama-sft")
    assert (run.reason, run.waits_for) == (
        "No machine fits: local has no ready machine",
        "machines",
    )
    await world.machine("gpu-07")
    await world.submit(name="busy", workers=1, gpus=4)  # behind it in the queue
    await world.schedule()
    run = await world.run("llama-sft")  # one 8-GPU machine could never hold its gang of two
    assert run.reason.startswith("Cannot plan workers") and run.waits_for == "plan"
    await world.machine("gpu-08")
    await world.schedule()
    run = await world.run("llama-sft")  # busy, placed meanwhile, holds half of gpu-07
    assert run.reason.startswith("Gang cannot be placed whole") and run.waits_for == "machines"
    await world.start("busy-0")
    await world.report("busy-0", "exited", exit_code=0)
    await world.schedule()
    run = await world.run("llama-sft")
    assert (run.state, run.waits_for) == ("Starting", None)
