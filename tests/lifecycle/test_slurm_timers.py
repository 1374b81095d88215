"""What time does to a run Slurm runs (issue 25): Slurm keeps its time limit and starts its gang
whole, so neither the lifecycle's time limit nor its gang barrier touches it; a stall is found
and counted, each worker from its own last progress (seed G-6), and Slurm keeps the job
running: no command goes to the node, nothing is stopped."""

from __future__ import annotations

from datetime import timedelta

from backend.lifecycle.rules import check_timers
from backend.lifecycle.sentences import CONTAINER_RUNNING
from backend.lifecycle.states import RUNNING, STARTING, Phase
from backend.lifecycle.views import Effects, RunPolicy, RunView, WorkerView
from tests.support import SEED_TIME

T0 = SEED_TIME


def slurm_run(state: str, policy: RunPolicy, progress: list[timedelta]) -> RunView:
    workers = [
        WorkerView(
            id=i + 1,
            rank=i,
            name=f"train-301-{i}",
            gpus=1,
            state=state,
            reason=CONTAINER_RUNNING,
            phase=Phase.RUNNING,
            machine_id=1,
            machine_name="n1",
            ready=True,
            progress_at=T0 + p,
            attempt=1,
        )
        for i, p in enumerate(progress)
    ]
    return RunView(
        id=1,
        name="train-301",
        state=state,
        reason="2 of 2 workers running",
        policy=policy,
        workers=workers,
        attempt=1,
        started_at=T0,
        running_since=T0,
        placed_at=T0,
        slurm_job="301",
    )


def test_slurms_run_past_the_lifecycles_limits_is_left_to_slurm() -> None:
    late = T0 + timedelta(hours=3)
    for state in (RUNNING, STARTING):  # past its time limit, past the gang barrier
        run = slurm_run(state, RunPolicy(time_limit=timedelta(hours=1)), [timedelta(0)] * 2)
        fx = Effects()
        check_timers(run, late, fx)
        assert (run.state, run.stop_cause, fx.commands, fx.transitions) == (state, None, [], [])


def test_a_stall_of_slurms_run_is_counted_and_slurm_keeps_it_running() -> None:
    policy = RunPolicy(stall_timeout=timedelta(minutes=5), on_stall="restart")
    run = slurm_run(RUNNING, policy, [timedelta(minutes=1), timedelta(minutes=20)])
    fx = Effects()
    check_timers(run, T0 + timedelta(minutes=21), fx)
    stalled = [(t.worker_id, t.at, t.phase) for t in fx.transitions if t.worker_id]
    assert stalled == [(1, T0 + timedelta(minutes=1), Phase.STALLED)]
    assert run.workers[0].stalled_since == T0 + timedelta(minutes=1)
    assert (run.state, run.stop_cause, fx.commands) == (RUNNING, None, [])
