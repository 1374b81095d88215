"""Rework (issue 23): after a restart, the steps since the run's last checkpoint are done again;
the productive GPU time from the restart until a worker reaches the step the run had reached
is rework, a part of productive time (never added to the total, never more than it). Without
checkpoint reports a run's rework is unknown, not 0.

Constructed histories through the real lifecycle and tick on a fake clock, checked by hand, in
the service, REST and GraphQL; and the rule's bound as a property."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from backend.accounting import rework, rules
from backend.accounting.rules import Period, RedoSpan
from backend.gateway import service as agents
from backend.metrics.rules import SampleIn
from backend.models import Worker
from tests.lifecycle.world import World
from tests.support import Tenancy
from tests.support.accounting import tick
from tests.support.api import get, graphql

T = datetime.fromisoformat("2026-10-01T00:00:00+00:00")
GPUS = 4


async def on_a_whole_minute(world: World) -> datetime:
    start = world.clock.now().replace(second=0, microsecond=0) + timedelta(minutes=1)
    world.clock.advance(seconds=(start - world.clock.now()).total_seconds())
    return start


async def training(world: World) -> None:
    """train: one worker of GPUS GPUs on gpu-07, running from a whole minute."""
    await world.machine("gpu-07")
    await world.submit(name="train", workers=1, gpus=GPUS)
    await world.schedule()
    await on_a_whole_minute(world)
    await world.start("train-0")


async def steps(
    world: World, worker: str, first: int, last: int, *, checkpoints: int | None
) -> None:
    """A step every 10 s from ``first`` to ``last``, a checkpoint every ``checkpoints`` steps
    (reported with each step after it, as the SDK does), the GPUs busy: sampled at each whole
    minute, sent as one batch at the end as an agent sends what it kept, then counted (the
    ledgers are the same however often the tick runs: test_tick.py). Reported as an agent's
    looks see them: every tenth step, the first and the last (the agent reads the file's last
    line, not every line)."""
    checkpoint = None
    if checkpoints is not None and first > 1:
        checkpoint = (first - 1) // checkpoints * checkpoints or None
    minutes = []
    for step in range(first, last + 1):
        if world.clock.now().second == 0:
            minutes.append(int(world.clock.now().timestamp() * 1000))
        world.clock.advance(seconds=10)
        if checkpoints is not None and step % checkpoints == 0:
            checkpoint = step
        if step % 10 == 0 or step in (first, last):
            await world.report(worker, "progress", step=step, checkpoint_step=checkpoint)
    async with world.db.transaction() as session:
        row = await session.scalar(select(Worker).where(Worker.name == worker))
        assert row is not None and row.machine_id is not None
        batch = [
            SampleIn(row.id, "task_gpu_utilization_ratio", gpu, at_ms, 0.9)
            for at_ms in minutes
            for gpu in row.gpu_ids
        ]
        await agents.metrics(session, row.machine_id, batch, world.clock)
    await world.timers()
    await tick(world)


async def restart_after_failure(world: World, worker: str) -> datetime:
    """The worker fails; after its backoff the gang is placed again (the restart's moment) and
    runs 10 s later, on a whole minute."""
    await world.report(worker, "exited", exit_code=1)
    await on_a_whole_minute(world)
    restart = world.clock.advance(seconds=50)
    await world.timers()
    await world.schedule()
    world.clock.advance(seconds=10)
    await world.start(worker)
    return restart


async def rework_of(
    client: httpx.AsyncClient, token: str, run: str
) -> tuple[dict[str, object], dict[str, object]]:
    """(REST's, GraphQL's) rework of a run."""
    rest = (await get(client, token, f"/runs/{run}/goodput")).json()["rework"]
    body = await graphql(
        client,
        token,
        """query($n: String!) { run(name: $n) { rework { gpuHours redos {
            attempt checkpointStep reachedStep stepsRedone caughtUp gpuHours } } } }""",
        n=run,
    )
    assert "errors" not in body, body
    return rest, body["data"]["run"]["rework"]


async def test_a_restart_at_step_500_after_a_checkpoint_at_400_redoes_100_steps(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await training(world)
    await steps(world, "train-0", 1, 500, checkpoints=200)  # checkpoints at 200 and 400
    restart = await restart_after_failure(world, "train-0")
    # back at the checkpoint (400): steps 401 to 500 again, 10 s each, then new steps
    await steps(world, "train-0", 401, 560, checkpoints=200)
    world.clock.advance(seconds=60)
    await tick(world)

    run = await world.run("train")
    async with world.db.read() as session:
        found = await rework.run_rework(session, run, world.clock.now())
    redo = found.redos[0]
    assert (redo.attempt, redo.restarted_at) == (2, restart)
    assert (redo.checkpoint_step, redo.reached_step, redo.steps_redone) == (400, 500, 100)
    assert redo.caught_up and redo.until == restart + timedelta(seconds=10 + 1000)
    assert found.gpu_seconds == 100 * 10 * GPUS  # exactly the time to redo 100 steps

    rest, ours = await rework_of(client, tenancy.member_token, "train")
    assert rest["gpu_hours"] == ours["gpuHours"] == pytest.approx(4000 / 3600, rel=1e-12)
    assert rest["redos"][0]["steps_redone"] == ours["redos"][0]["stepsRedone"] == 100
    assert ours["redos"][0] == {
        "attempt": 2,
        "checkpointStep": 400,
        "reachedStep": 500,
        "stepsRedone": 100,
        "caughtUp": True,
        "gpuHours": pytest.approx(4000 / 3600, rel=1e-12),
    }
    # a part of productive time: the week's report by run shows it beside USED
    report = (await get(client, tenancy.member_token, "/goodput", by="run")).json()
    row = next(r for r in report["ledgers"] if r["name"] == "train")
    assert row["rework_gpu_hours"] == pytest.approx(4000 / 3600, rel=1e-12)
    assert row["rework_gpu_hours"] <= row["productive_gpu_hours"]
    assert report["total"]["rework_gpu_hours"] == pytest.approx(4000 / 3600, rel=1e-12)
    assert report["total"]["rework_unknown_runs"] == 0
    by_machine = (await get(client, tenancy.member_token, "/goodput", by="machine")).json()
    assert by_machine["ledgers"][0]["rework_gpu_hours"] == pytest.approx(4000 / 3600)


async def test_a_restart_during_a_redo_keeps_the_step_to_reach(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # fails at 500 (checkpoint 400), again at 450 while redoing; the second redo still goes to 500
    await training(world)
    await steps(world, "train-0", 1, 500, checkpoints=200)
    first = await restart_after_failure(world, "train-0")
    await steps(world, "train-0", 401, 450, checkpoints=200)
    second = await restart_after_failure(world, "train-0")
    await steps(world, "train-0", 401, 520, checkpoints=200)
    world.clock.advance(seconds=60)
    await tick(world)

    async with world.db.read() as session:
        found = await rework.run_rework(session, await world.run("train"), world.clock.now())
    one, two = found.redos
    assert (one.restarted_at, one.until, one.caught_up) == (first, second, False)
    assert (two.restarted_at, two.reached_step, two.checkpoint_step) == (second, 500, 400)
    assert two.caught_up and two.until == second + timedelta(seconds=10 + 1000)
    assert one.gpu_seconds == 50 * 10 * GPUS
    assert two.gpu_seconds == 100 * 10 * GPUS
    assert found.gpu_seconds == 150 * 10 * GPUS
    rest, _ = await rework_of(client, tenancy.member_token, "train")
    assert rest["gpu_hours"] == pytest.approx(6000 / 3600, rel=1e-12)


async def test_without_checkpoint_reports_the_runs_rework_is_unknown_not_0(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await training(world)
    await steps(world, "train-0", 1, 120, checkpoints=None)
    await restart_after_failure(world, "train-0")
    await steps(world, "train-0", 1, 130, checkpoints=None)
    world.clock.advance(seconds=60)
    await tick(world)

    rest, ours = await rework_of(client, tenancy.member_token, "train")
    assert rest["gpu_hours"] is None and ours["gpuHours"] is None
    assert rest["redos"][0]["checkpoint_step"] is None and rest["redos"][0]["reached_step"] == 120
    report = (await get(client, tenancy.member_token, "/goodput", by="run")).json()
    row = next(r for r in report["ledgers"] if r["name"] == "train")
    assert (row["rework_gpu_hours"], row["rework_unknown_runs"]) == (None, 1)
    assert (report["total"]["rework_gpu_hours"], report["total"]["rework_unknown_runs"]) == (0, 1)


async def test_a_run_that_never_restarted_redid_nothing(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await training(world)
    await steps(world, "train-0", 1, 30, checkpoints=None)
    rest, ours = await rework_of(client, tenancy.member_token, "train")
    assert rest == {"gpu_hours": 0.0, "redos": []}
    assert ours == {"gpuHours": 0.0, "redos": []}


async def test_work_the_failure_undid_stays_productive_in_its_attempt(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # seed G-16: work an attempt did and the code did not keep is not lost here: it was
    # productive then. Steps 401 to 500 of the first attempt are redone after the failure, yet
    # the first attempt's 500 steps stay productive, to the second, in the ledger and its
    # intervals; lost is asked less productive, that time not among it.
    await training(world)
    started = world.clock.now()
    await steps(world, "train-0", 1, 500, checkpoints=200)
    failed = world.clock.now()
    await restart_after_failure(world, "train-0")
    await steps(world, "train-0", 401, 560, checkpoints=200)
    world.clock.advance(seconds=60)
    await tick(world)

    found = await get(
        client,
        tenancy.member_token,
        "/goodput/intervals",
        by="run",
        name="train",
        category="productive",
    )
    productive = found.json()["intervals"]
    first = [i for i in productive if datetime.fromisoformat(i["end"]) <= failed]
    assert datetime.fromisoformat(first[0]["start"]) == started
    assert sum(i["gpu_hours"] for i in first) == pytest.approx(500 * 10 * GPUS / 3600)
    report = (await get(client, tenancy.member_token, "/goodput", by="run")).json()
    [row] = report["ledgers"]
    assert row["productive_gpu_hours"] == pytest.approx(sum(i["gpu_hours"] for i in productive))
    assert (
        row["productive_gpu_hours"] > sum(i["gpu_hours"] for i in first) + row["rework_gpu_hours"]
    )
    asked = row["allocated_gpu_hours"] + row["waiting_gpu_hours"]
    assert row["lost_gpu_hours"] == pytest.approx(asked - row["productive_gpu_hours"])


def test_rework_is_inside_the_redo_and_the_period() -> None:
    redo = RedoSpan(T + timedelta(minutes=10), T + timedelta(minutes=20), 500, 400)
    week = Period(T, T + timedelta(days=7))
    assert rules.redone_seconds(T, T + timedelta(hours=1), 2, redo, week) == 600 * 2
    assert rules.redone_seconds(T, T + timedelta(minutes=5), 2, redo, week) == 0
    late = Period(T + timedelta(minutes=15), T + timedelta(hours=1))
    assert rules.redone_seconds(T, T + timedelta(hours=1), 1, redo, late) == 300
    still = RedoSpan(T + timedelta(minutes=10), None, 500, 400)
    assert rules.redone_seconds(T, T + timedelta(hours=1), 1, still, week) == 3000
    assert redo.steps_redone == 100 and RedoSpan(T, None, 500, None).steps_redone is None


minutes = st.integers(min_value=0, max_value=600)


@given(
    cuts=st.lists(minutes, min_size=2, max_size=12, unique=True),
    redo=st.tuples(minutes, st.one_of(st.none(), minutes)),
    period=st.tuples(minutes, minutes),
    gpus=st.integers(min_value=1, max_value=8),
)
def test_rework_never_exceeds_productive(
    cuts: list[int], redo: tuple[int, int | None], period: tuple[int, int], gpus: int
) -> None:
    """However a worker's productive time is cut into intervals, and wherever the redo and the
    period fall, rework is at most the productive time in the period, and the same whatever
    the cuts (exact to the second)."""
    at = sorted(T + timedelta(minutes=m) for m in cuts)
    span = RedoSpan(
        T + timedelta(minutes=redo[0]),
        None if redo[1] is None else T + timedelta(minutes=redo[0] + redo[1]),
        500,
        400,
    )
    p = Period(T + timedelta(minutes=min(period)), T + timedelta(minutes=max(period) + 1))
    parts = [rules.redone_seconds(a, b, gpus, span, p) for a, b in itertools.pairwise(at)]
    whole = rules.redone_seconds(at[0], at[-1], gpus, span, p)
    productive = max((min(at[-1], p.end) - max(at[0], p.start)).total_seconds() * gpus, 0.0)
    assert 0 <= sum(parts) <= productive
    assert sum(parts) == whole
