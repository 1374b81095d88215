"""Stalls per rank (issue 20): every worker whose progress stopped is counted stalled from its own
last progress, whatever stops its gang first; a workload that reports its steps is not kept
from a stall by output alone. Seed G-6 ("stalled: running while stalled, from when it stopped
making progress"), G-7 (stopping because it stalled)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from backend.accounting import counting, interval_queries
from backend.lifecycle.endings import worker_exited
from backend.lifecycle.progress import worker_progress
from backend.lifecycle.rules import STALLED_WITH_GANG, check_timers
from backend.lifecycle.sentences import CONTAINER_RUNNING, End, EndCause
from backend.lifecycle.states import RUNNING, Cause, Phase
from backend.lifecycle.stops import preempt, stop
from backend.lifecycle.views import Effects, RunPolicy, RunView, WorkerView
from backend.metrics import service as metrics_service
from backend.metrics.rules import SampleIn
from backend.models import Worker
from tests.lifecycle.world import World
from tests.support import SEED_TIME

T0 = SEED_TIME
TIMEOUT = timedelta(minutes=5)


# -- the rules alone ----------------------------------------------------------------------------


def gang(progress: list[timedelta], on_stall: str) -> RunView:
    """A running gang whose rank i last made progress at T0 + progress[i]."""
    workers = [
        WorkerView(
            id=i + 1,
            rank=i,
            name=f"g-{i}",
            gpus=1,
            state=RUNNING,
            reason=CONTAINER_RUNNING,
            phase=Phase.RUNNING,
            machine_id=i + 1,
            machine_name=f"m{i}",
            ready=True,
            progress_at=T0 + p,
            attempt=1,
        )
        for i, p in enumerate(progress)
    ]
    policy = RunPolicy(stall_timeout=TIMEOUT, on_stall=on_stall)
    return RunView(
        id=1,
        name="g",
        state=RUNNING,
        reason="",
        policy=policy,
        workers=workers,
        attempt=1,
        started_at=T0,
        running_since=T0,
    )


def stalled_at(fx: Effects) -> dict[int, datetime]:
    return {
        t.worker_id: t.at
        for t in fx.transitions
        if t.phase == Phase.STALLED and t.worker_id is not None
    }


quiet = st.integers(0, 600).map(lambda s: timedelta(seconds=s))


@settings(max_examples=300, deadline=None)
@given(
    progress=st.lists(quiet, min_size=1, max_size=4),
    after=st.integers(0, 900).map(lambda s: timedelta(seconds=s)),
    on_stall=st.sampled_from(["keep", "restart"]),
    stopper=st.sampled_from(["timers", "failure", "owner", "preemption"]),
    failing=st.integers(0, 3),
)
def test_every_quiet_rank_is_stalled_from_its_own_progress_whatever_stops_the_gang(
    progress: list[timedelta], after: timedelta, on_stall: str, stopper: str, failing: int
) -> None:
    run = gang(progress, on_stall)
    now = T0 + after
    fx = Effects()
    failing %= len(run.workers)
    if stopper == "timers":
        check_timers(run, now, fx)
    elif stopper == "failure":
        w = run.workers[failing]
        w.progress_at = min(w.progress_at or now, now)  # its own exit is its last sign
        worker_exited(run, w, now, fx, End(EndCause.EXITED, 1), attempt=1)
    elif stopper == "owner":
        stop(run, "alice", now, fx)
    else:
        preempt(run, "urgent", now, fx)
    found = stalled_at(fx)
    over = {w.id for w in run.workers if now - (w.progress_at or now) >= TIMEOUT}
    stall_stop = any(t.phase == Phase.STOPPING_STALL for t in fx.transitions)
    with_gang = {
        w.id for w in run.workers if now - (w.progress_at or now) >= TIMEOUT * STALLED_WITH_GANG
    }
    # Each quiet for the timeout is stalled, each from its own last progress ...
    assert over <= set(found)
    for w in run.workers:
        if w.id in found:
            assert found[w.id] == w.progress_at == w.stalled_since
    # ... and no other, but those that stopped with a gang a stall stops.
    assert set(found) == (with_gang if stall_stop else over)
    if on_stall == "keep" and stopper == "timers":
        assert not stall_stop and all(w.state == RUNNING for w in run.workers)
    if on_stall == "restart" and stopper == "timers" and over:
        assert stall_stop and run.stop_cause == Cause.STALL


def test_both_ranks_hung_at_the_same_step_are_both_stalled_when_the_first_stops_the_gang() -> None:
    # Rank 1 wrote its last line 2 s after rank 0: the check that finds rank 0 stalled comes
    # before rank 1's own five minutes are up. Before issue 20, rank 1 ran (productive, then
    # idle) until the stop.
    run = gang([timedelta(seconds=60), timedelta(seconds=62)], "restart")
    fx = Effects()
    check_timers(run, T0 + timedelta(seconds=361), fx)
    assert stalled_at(fx) == {1: T0 + timedelta(seconds=60), 2: T0 + timedelta(seconds=62)}
    assert [(w.state, w.phase, w.stalled_since) for w in run.workers] == [
        ("Stopping", Phase.STOPPING_STALL, T0 + timedelta(seconds=60)),
        ("Stopping", Phase.STOPPING_STALL, T0 + timedelta(seconds=62)),
    ]
    assert run.reason == "Worker g-0 stalled on m0: no progress for 5m"


def test_a_workload_that_reports_steps_is_not_kept_from_a_stall_by_its_output() -> None:
    # The run that never starts (issue 20): its ranks print a rendezvous retry warning every
    # few seconds. Once a worker reports steps, only a step is progress.
    run = gang([timedelta(0)], "keep")
    w = run.workers[0]
    fx = Effects()
    worker_progress(run, w, T0 + timedelta(seconds=30), fx, step=10)
    for s in range(60, 400, 5):
        worker_progress(run, w, T0 + timedelta(seconds=s), fx)  # output alone
    check_timers(run, T0 + timedelta(seconds=400), fx)
    assert w.stalled_since == T0 + timedelta(seconds=30)
    # A workload that never reports steps makes progress by its output (DESIGN §3).
    run = gang([timedelta(0)], "keep")
    w = run.workers[0]
    for s in range(60, 400, 5):
        worker_progress(run, w, T0 + timedelta(seconds=s), fx)
    check_timers(run, T0 + timedelta(seconds=400), fx)
    assert w.stalled_since is None


# -- through the service, the goodput tick and the ledgers, on SQLite and PostgreSQL -------------


async def sample_busy(world: World) -> None:
    """The hung ranks' GPUs spin in their collective: 80% busy (a stall, not idleness)."""
    async with world.db.transaction() as session:
        for w in await session.scalars(select(Worker).where(Worker.state == "Running")):
            assert w.machine_id is not None
            at_ms = int(world.clock.now().timestamp() * 1000)
            samples = [SampleIn(w.id, "task_gpu_utilization_ratio", 0, at_ms, 0.8, w.attempt)]
            await metrics_service.ingest(session, w.machine_id, samples)


async def intervals_by_worker(world: World) -> dict[str, list[tuple[datetime, datetime, str]]]:
    async with world.db.read() as session:
        rows = await interval_queries.intervals_of(
            session,
            start=T0 - timedelta(days=1),
            end=T0 + timedelta(days=1),
            workspace_ids=None,
            limit=100_000,
        )
    out: dict[str, list[tuple[datetime, datetime, str]]] = defaultdict(list)
    for r in rows:
        out[r.worker_name].append((r.start_at, r.end_at, r.category))
    return out


@pytest.mark.parametrize("on_stall", ["restart", "keep"])
async def test_a_hung_gang_is_counted_stalled_rank_by_rank(world: World, on_stall: str) -> None:
    # seed G-6, G-7
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(workers=2, gpus=4, stall_timeout="5m", on_stall=on_stall)
    await world.schedule()
    await world.start("llama-sft-0", "llama-sft-1")
    started = world.clock.now()
    await sample_busy(world)
    world.clock.advance(seconds=50)
    await sample_busy(world)
    await world.report("llama-sft-0", "progress", step=100)
    last = {"llama-sft-0": world.clock.now()}
    world.clock.advance(seconds=15)
    # Both hang at step 100, rank 1's last line 15 s after rank 0's: when rank 0 is found
    # stalled (and with restart stops the gang) rank 1 has been quiet 4m55s.
    await world.report("llama-sft-1", "progress", step=100)
    last["llama-sft-1"] = world.clock.now()
    for _ in range(8 * 3):  # timers every 20 s, a tick a minute, for eight minutes
        world.clock.advance(seconds=20)
        await sample_busy(world)
        await world.timers()
        if world.clock.now().second < 20:
            async with world.db.transaction() as session:
                await counting.tick(session, world.clock)
        for name in [w.name for w in await world.workers("llama-sft") if w.state == "Stopping"]:
            await world.report(name, "exited", exit_code=143)
    workers = {w.name: w for w in await world.workers("llama-sft")}
    for name, at in last.items():
        phases = await world.phases(name)
        assert (at, "Running", "stalled") in [p[:3] for p in phases], phases
        if on_stall == "keep":
            assert workers[name].stalled_since == at
    world.clock.advance(minutes=1)
    async with world.db.transaction() as session:
        await counting.tick(session, world.clock)
    until = counting.minute_floor(world.clock.now())
    counted = await intervals_by_worker(world)
    for name, at in last.items():
        parts = sorted(p for p in counted[name] if p[0] < until)
        # Productive while it stepped, stalled from its own last progress on, nothing else.
        assert parts[0][0] == started
        before = {c for s, e, c in parts if e <= at}
        after = {c for s, e, c in parts if s >= at}
        assert before == {"productive"}, parts
        assert after == {"stalled"}, parts
        stalled = sum((e - s).total_seconds() for s, e, c in parts if c == "stalled")
        if on_stall == "keep":  # still running, stalled: until the last minute counted
            assert stalled == (until - at).total_seconds()
        for a, b in itertools.pairwise(parts):
            assert a[1] == b[0]  # no second skipped or counted twice


async def test_a_failure_that_stops_the_gang_first_finds_the_rank_already_stalled(
    world: World,
) -> None:
    # Rank 0 hung at +50 s; rank 1 then crashed at +6 min, before any check looked at rank 0.
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.submit(workers=2, gpus=4, stall_timeout="5m", restart_policy="never")
    await world.schedule()
    await world.start("llama-sft-0", "llama-sft-1")
    world.clock.advance(seconds=50)
    await world.report("llama-sft-0", "progress", step=100)
    hung = world.clock.now()
    world.clock.advance(minutes=5, seconds=10)
    await world.report("llama-sft-1", "progress", step=400)
    await world.report("llama-sft-1", "exited", exit_code=1)
    phases = [p[:3] for p in await world.phases("llama-sft-0")]
    assert phases[-2:] == [
        (hung, "Running", "stalled"),
        (world.clock.now(), "Stopping", "stopping:failure"),
    ]
    assert [p[:3] for p in await world.phases("llama-sft-1")][-1][1] == "Failed"
