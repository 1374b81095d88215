"""Every failure keeps its story (issue 20): each attempt that ends abnormally — an exit, an OOM
kill, a stall restart, the time limit, a preemption, a lost machine — leaves its last failure
snapshot (seed L-21, L-22: reason, failed_at, exit_code, log_tail), stored with the worker so
that it survives restarts; the API turns it into the seed's advice (failedWorker, advice,
restartLoop in GraphQL; failed_worker, advice, restart_loop in REST), and a preempted run's
reason says so until it runs again. On SQLite and PostgreSQL (the db fixture)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from backend.db import Database
from backend.gateway import service as agents
from backend.gateway.service import WorkerEventInfo
from backend.lifecycle.sentences import EndCause
from backend.machines import service as machines
from backend.models import Machine, StateTransition, Worker
from tests.lifecycle.world import LEASE, World
from tests.support import FakeClock, Tenancy
from tests.support.api import graphql

QUERY = """query($name: String!) { run(name: $name) { state reason
  advice { reason exitCode kind lookAt open }
  failedWorker { name state lastFailure advice { kind lookAt } }
  restartLoop { restarts maxRestarts restartAt worker { name lastFailure advice { kind lookAt } } }
  waitAdvice { kind lookAt }
  workers { name state lastFailure } } }"""

TIME_LIMIT = "The time limit: raise it, or checkpoint and resume."
PREEMPTED = "Not a failure: it is queued again."
MACHINE_LOST = "The machine, not the run: see Machines troubleshooting. Restarted under its policy."
STALLED = (
    "Check the metrics around the failure: memory climbing to the limit, a GPU at 0% (a hang), "
    "network traffic stopping."
)
LOOP = (
    "The console's Restarting in a loop panel: restarts, when the next attempt is, and the last "
    "failure's output. Each failure doubles the wait, up to 5 minutes; after 10 restarts in a row "
    "it gives up; 10 minutes running resets the count."
)
TAIL = "step 4409 loss 1.402\n[rank0]: step 4410 loss 1.401\n"


@pytest.fixture
async def world(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    return world


async def started(world: World, name: str = "llama-sft", workers: int = 1, **spec: Any) -> None:
    await world.submit(name=name, workers=workers, gpus=8, **spec)
    world.clock.advance(seconds=1)
    await world.schedule()
    world.clock.advance(seconds=1)
    await world.start(*(f"{name}-{rank}" for rank in range(workers)))


async def run_json(client: httpx.AsyncClient, token: str, name: str) -> dict[str, Any]:
    answer = await graphql(client, token, QUERY, name=name)
    assert "errors" not in answer, answer
    run: dict[str, Any] = answer["data"]["run"]
    return run


def snap(worker: Worker) -> dict[str, Any]:
    """Its last failure snapshot, which it must have."""
    assert worker.last_failure is not None, f"{worker.name} has no failure snapshot"
    return worker.last_failure


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_an_exit_and_an_oom_kill_keep_their_snapshot(world: World) -> None:
    # seed L-21: the reason, the exit code, the time and the last lines
    await started(world, max_restarts=3)
    world.clock.advance(seconds=10)
    await world.report("llama-sft-0", "exited", exit_code=1, log_tail="Traceback …\n")
    [worker] = await world.workers("llama-sft")
    assert worker.last_failure == {
        "reason": "Exited with code 1",
        "failed_at": world.clock.now().isoformat(),
        "exit_code": 1,
        "log_tail": "Traceback …\n",
    }
    world.clock.advance(seconds=10)
    await world.schedule()
    await world.start("llama-sft-0")
    oom = "OOMKilled: the container exceeded its memory limit"
    await world.report(
        "llama-sft-0", "exited", exit_code=137, cause=EndCause.OOM_KILLED, log_tail=TAIL
    )
    [worker] = await world.workers("llama-sft")
    assert (snap(worker)["reason"], snap(worker)["exit_code"]) == (oom, 137)
    assert snap(worker)["log_tail"] == TAIL


async def test_a_stall_restart_keeps_the_stalled_workers_snapshot_and_the_loop_panel(
    world: World, client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    # issue 20: six stall restarts left last_failure null and no Restarting in a loop panel
    # (seed L-58, L-68, L-69)
    await started(world, workers=2, stall_timeout="5m")
    for restart in range(1, 7):
        world.clock.advance(minutes=4)
        await world.report("llama-sft-0", "progress")  # rank 1 never reports: it stalls
        world.clock.advance(minutes=2)
        await world.timers()
        stopped_at = world.clock.now()
        world.clock.advance(seconds=2)
        await world.report("llama-sft-1", "exited", exit_code=143, log_tail=f"hung {restart}\n")
        await world.report("llama-sft-0", "exited", exit_code=0, log_tail="stopped cleanly\n")
        state, reason = await world.status("llama-sft")
        assert state == "Pending" and reason.startswith("Restarting in ")
        assert f"({restart}/10): Worker llama-sft-1 stalled on gpu-0" in reason
        assert reason.endswith(": no progress for 5m")
        rank0, rank1 = await world.workers("llama-sft")
        assert rank1.last_failure == {
            "reason": "Stalled: no progress for 5m",
            "failed_at": (stopped_at + timedelta(seconds=2)).isoformat(),
            "exit_code": 143,
            "log_tail": f"hung {restart}\n",
        }
        assert rank0.last_failure is None  # it did not stall: stopped with its gang
        run = await run_json(client, tenancy.member_token, "llama-sft")
        loop = run["restartLoop"]
        assert (loop["restarts"], loop["maxRestarts"]) == (restart, 10)
        assert loop["restartAt"] is not None
        assert loop["worker"]["name"] == "llama-sft-1"
        assert loop["worker"]["lastFailure"]["log_tail"] == f"hung {restart}\n"
        assert loop["worker"]["advice"] == {"kind": "stalled", "lookAt": STALLED}
        assert run["advice"]["kind"] == "stalled"
        assert run["waitAdvice"] == {"kind": "restart_loop", "lookAt": LOOP}
        world.clock.advance(minutes=6)  # past the longest wait (5 minutes)
        assert (await world.schedule()).placed == ["llama-sft"]
        await world.start("llama-sft-0", "llama-sft-1")
    # It runs again: the snapshot is still there (stored), and so is the loop panel.
    rank1 = (await world.workers("llama-sft"))[1]
    assert (rank1.state, rank1.restarts, snap(rank1)["log_tail"]) == (
        "Running",
        6,
        "hung 6\n",
    )
    run = await run_json(client, tenancy.member_token, "llama-sft")
    assert run["restartLoop"]["restarts"] == 6 and run["restartLoop"]["restartAt"] is None
    assert run["advice"] is None  # running: nothing failed now
    # The REST shim carries the same.
    job = (await client.get("/v1/jobs/llama-sft", headers=auth(tenancy.member_token))).json()
    assert job["restart_loop"]["restarts"] == 6
    assert job["restart_loop"]["worker"] == "llama-sft-1"
    assert job["restart_loop"]["last_failure"]["log_tail"] == "hung 6\n"
    # Ten minutes running resets the count: no loop any more (seed L-69).
    world.clock.advance(minutes=10)
    assert (await run_json(client, tenancy.member_token, "llama-sft"))["restartLoop"] is None


async def test_a_time_limit_keeps_its_snapshot_and_fails_with_its_advice(
    world: World, client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    # issue 20: failedWorker and advice were null; seed L-54
    await started(world, workers=2, time_limit="12h")
    world.clock.advance(hours=12)
    await world.timers()
    world.clock.advance(seconds=3)
    await world.report("llama-sft-1", "exited", exit_code=0, log_tail="saved nothing\n")
    await world.report("llama-sft-0", "exited", exit_code=143, log_tail=TAIL)
    assert await world.status("llama-sft") == ("Failed", "Exceeded its time limit of 12h")
    rank0, rank1 = await world.workers("llama-sft")
    assert rank0.last_failure == {
        "reason": "Exceeded its time limit of 12h",
        "failed_at": world.clock.now().isoformat(),
        "exit_code": 143,
        "log_tail": TAIL,
    }
    assert snap(rank1)["log_tail"] == "saved nothing\n"
    run = await run_json(client, tenancy.member_token, "llama-sft")
    assert run["advice"] == {
        "reason": "Exceeded its time limit of 12h",
        "exitCode": 143,
        "kind": "time_limit",
        "lookAt": TIME_LIMIT,
        "open": "log",
    }
    assert run["failedWorker"]["name"] == "llama-sft-0"  # both ended together: the first rank
    assert run["failedWorker"]["advice"] == {"kind": "time_limit", "lookAt": TIME_LIMIT}
    assert run["restartLoop"] is None
    job = (await client.get("/v1/jobs/llama-sft", headers=auth(tenancy.member_token))).json()
    assert job["failed_worker"] == "llama-sft-0"
    assert job["advice"]["look_at"] == TIME_LIMIT
    task = (await client.get("/v1/tasks/llama-sft-0", headers=auth(tenancy.member_token))).json()
    assert task["advice"]["kind"] == "time_limit"
    assert task["last_failure"]["log_tail"] == TAIL


async def test_an_exhausted_retry_budget_says_the_first_cause_is_in_last_failure(
    world: World, client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    # issue 20: it said "Your program: its log."; seed L-56
    await started(world, max_restarts=2)
    for _ in range(3):
        world.clock.advance(seconds=5)
        await world.report("llama-sft-0", "exited", exit_code=1, log_tail="ValueError\n")
        world.clock.advance(minutes=1)
        if (await world.schedule()).placed:
            await world.start("llama-sft-0")
    assert await world.status("llama-sft") == (
        "Failed",
        "Retry budget exhausted after 2/2 restarts",
    )
    run = await run_json(client, tenancy.member_token, "llama-sft")
    assert run["advice"]["kind"] == "retry_budget"
    assert run["advice"]["lookAt"] == (
        "It failed 2 times in a row: the first failure's cause is in last_failure."
    )
    assert run["failedWorker"]["lastFailure"]["log_tail"] == "ValueError\n"
    job = (await client.get("/v1/jobs/llama-sft", headers=auth(tenancy.member_token))).json()
    assert job["advice"]["kind"] == "retry_budget" and job["failed_worker"] == "llama-sft-0"


async def test_a_preempted_run_keeps_its_snapshot_and_says_so_until_it_runs_again(
    world: World, client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    # issue 20: "Not a failure: it is queued again" was never shown and the next pass replaced
    # the reason; seed L-57
    await started(world, name="sweep-7", workers=2, priority=10)
    world.clock.advance(minutes=5)
    await world.submit(name="llm", workers=2, gpus=8, priority=90)
    assert (await world.schedule()).preempted == ["sweep-7"]
    world.clock.advance(seconds=3)
    await world.report("sweep-7-0", "exited", exit_code=143, log_tail=TAIL)
    await world.report("sweep-7-1", "exited", exit_code=143, log_tail="rank 1\n")
    sentence = "Preempted by higher-priority work (llm)"
    assert await world.status("sweep-7") == ("Pending", sentence)
    rank0, _ = await world.workers("sweep-7")
    assert rank0.last_failure == {
        "reason": sentence,
        "failed_at": world.clock.now().isoformat(),
        "exit_code": 143,
        "log_tail": TAIL,
    }
    await world.schedule()  # llm is placed; sweep-7 waits for room
    world.clock.advance(seconds=30)
    await world.schedule()
    assert await world.status("sweep-7") == ("Pending", sentence)
    run = await run_json(client, tenancy.member_token, "sweep-7")
    assert run["advice"] == {
        "reason": sentence,
        "exitCode": None,
        "kind": "preempted",
        "lookAt": PREEMPTED,
        "open": "log",
    }
    assert run["failedWorker"] is None and run["restartLoop"] is None  # not a failure
    job = (await client.get("/v1/jobs/sweep-7", headers=auth(tenancy.member_token))).json()
    assert job["advice"]["look_at"] == PREEMPTED
    # llm ends: sweep-7 runs again, and its reason says what it does now.
    await world.start("llm-0", "llm-1")
    await world.report("llm-0", "exited", exit_code=0)
    await world.report("llm-1", "exited", exit_code=0)
    assert (await world.schedule()).placed == ["sweep-7"]
    state, reason = await world.status("sweep-7")
    assert (state, reason) == ("Starting", "Starting together: 0 of 2 ready")
    assert (await run_json(client, tenancy.member_token, "sweep-7"))["advice"] is None


async def test_an_owners_stop_keeps_no_snapshot(world: World) -> None:
    await started(world)
    async with world.db.transaction() as session:
        from backend.lifecycle import service as lifecycle
        from backend.models import Run

        run = await session.scalar(select(Run).where(Run.name == "llama-sft"))
        assert run is not None
        await lifecycle.stop_run(session, world.clock, run, "alice")
    await world.report("llama-sft-0", "exited", exit_code=143, log_tail=TAIL)
    assert await world.status("llama-sft") == ("Stopped", "Stopped by alice")
    assert (await world.workers("llama-sft"))[0].last_failure is None


async def lose(world: World, machine: str) -> int:
    """The machine's lease runs out (the other's is renewed): its workers fail with it."""
    world.clock.advance(seconds=LEASE.total_seconds() + 1)
    async with world.db.transaction() as session:
        rows = {m.name: m for m in await session.scalars(select(Machine))}
        for name, row in rows.items():
            if name != machine:
                await machines.heartbeat(session, world.clock, row.id, LEASE)
        await machines.expire_leases(session, world.clock, LEASE)
        return rows[machine].id


async def exit_event(
    world: World, machine_id: int, worker_id: int, attempt: int, tail: str
) -> None:
    """The agent of ``machine_id`` reports how one of its workers ended (as its stream does)."""
    event = WorkerEventInfo(
        worker_id=worker_id,
        attempt=attempt,
        kind="exited",
        at=world.clock.now(),
        reason="",
        exit_code=143,
        log_tail=tail,
    )
    async with world.db.transaction() as session:
        await agents.worker_event(session, world.clock, machine_id, event)


async def counts(world: World) -> tuple[int, list[tuple[str, str, str]]]:
    async with world.db.read() as session:
        history = await session.scalar(select(func.count()).select_from(StateTransition))
    workers = [(w.name, w.state, w.phase) for w in await world.workers("llama-sft")]
    return int(history or 0), workers


async def test_a_lost_machines_snapshot_gets_its_lines_when_its_agent_is_back(
    world: World, client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    # issue 20: a machine lost left an empty log_tail; seed L-55
    await started(world)
    [worker] = await world.workers("llama-sft")
    names = await machine_names(world)
    lost_id = worker.machine_id
    assert lost_id is not None
    await lose(world, names[lost_id])
    [lost] = await world.workers("llama-sft")
    assert (lost.state, snap(lost)["reason"], snap(lost)["log_tail"]) == (
        "Pending",  # to be placed again under its policy
        "Machine lost: its lease expired",
        "",
    )
    failed_at = snap(lost)["failed_at"]
    world.clock.advance(seconds=15)
    assert (await world.schedule()).placed == ["llama-sft"]  # attempt 2, on the other machine
    other_id = next(m for m in names if m != lost_id)
    assert (await world.workers("llama-sft"))[0].machine_id == other_id
    before = await counts(world)
    # Another machine's agent cannot write it; nor can a report of another attempt.
    await exit_event(world, other_id, worker.id, 1, "not mine\n")
    await exit_event(world, lost_id, worker.id, 2, "not that attempt\n")
    assert snap((await world.workers("llama-sft"))[0])["log_tail"] == ""
    # The lost machine's agent is back: it reports the worker of the lost attempt, its lines.
    world.clock.advance(seconds=40)
    await exit_event(world, lost_id, worker.id, 1, TAIL)
    assert (await world.workers("llama-sft"))[0].last_failure == {
        "reason": "Machine lost: its lease expired",
        "failed_at": failed_at,
        "exit_code": None,
        "log_tail": TAIL,
    }
    assert await counts(world) == before  # no state, no history, no accounting changed
    await exit_event(world, lost_id, worker.id, 1, "a second report\n")  # taken once
    assert snap((await world.workers("llama-sft"))[0])["log_tail"] == TAIL
    run = await run_json(client, tenancy.member_token, "llama-sft")
    loop = run["restartLoop"]
    assert (loop["restarts"], loop["worker"]["name"]) == (1, "llama-sft-0")
    assert loop["worker"]["lastFailure"]["log_tail"] == TAIL
    assert loop["worker"]["advice"] == {"kind": "machine_lost", "lookAt": MACHINE_LOST}


async def machine_names(world: World) -> dict[int, str]:
    async with world.db.read() as session:
        return {m.id: m.name for m in await session.scalars(select(Machine))}


async def test_another_workspace_reads_none_of_it(
    world: World, client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    await started(world, time_limit="1h")
    world.clock.advance(hours=1)
    await world.timers()
    await world.report("llama-sft-0", "exited", exit_code=143, log_tail="secret lines\n")
    assert (await run_json(client, tenancy.member_token, "llama-sft"))["advice"] is not None
    query = QUERY.replace("$name: String!", "$name: String!, $ws: String").replace(
        "run(name: $name)", "run(name: $name, workspace: $ws)"
    )
    for token in (tenancy.other_token, tenancy.foreign_token):
        answer = await graphql(client, token, query, name="llama-sft", ws="default")
        assert "secret lines" not in str(answer) and "time_limit" not in str(answer)
        for path in ("/v1/jobs/llama-sft", "/v1/tasks/llama-sft-0"):
            rest = await client.get(f"{path}?workspace=default", headers=auth(token))
            assert rest.status_code in (403, 404), rest.text
            assert "secret lines" not in rest.text


async def test_an_end_reported_on_the_agents_stream_keeps_its_state_and_its_snapshot(
    world: World,
) -> None:
    # The stream's path (agents.worker_event): the end's state, reason and exit code are
    # written with the snapshot (looking for a lost machine's snapshot read them over once).
    await started(world, workers=2, time_limit="1h")
    rank0, rank1 = await world.workers("llama-sft")
    world.clock.advance(hours=1)
    await world.timers()
    assert rank0.machine_id is not None and rank1.machine_id is not None
    await exit_event(world, rank0.machine_id, rank0.id, 1, TAIL)
    await exit_event(world, rank1.machine_id, rank1.id, 1, "rank 1\n")
    assert await world.status("llama-sft") == ("Failed", "Exceeded its time limit of 1h")
    for worker, tail in zip(await world.workers("llama-sft"), (TAIL, "rank 1\n"), strict=True):
        assert (worker.state, worker.reason, worker.exit_code) == (
            "Stopped",
            "Stopped at its time limit",
            143,
        )
        assert snap(worker) == {
            "reason": "Exceeded its time limit of 1h",
            "failed_at": world.clock.now().isoformat(),
            "exit_code": 143,
            "log_tail": tail,
        }


async def test_a_failure_reported_on_the_agents_stream_keeps_its_state_and_snapshot(
    world: World,
) -> None:
    await started(world, restart_policy="never")
    [worker] = await world.workers("llama-sft")
    assert worker.machine_id is not None
    await exit_event(world, worker.machine_id, worker.id, 1, TAIL)
    [worker] = await world.workers("llama-sft")
    assert (worker.state, worker.reason, worker.exit_code) == (
        "Failed",
        "Exited with code 143",
        143,
    )
    assert snap(worker)["log_tail"] == TAIL
