"""What time does to a run Slurm runs (issue 25): Slurm keeps its time limit and starts its gang
whole, so neither the lifecycle's time limit nor its gang barrier touches it; a stall is found
and counted, each worker from its own last progress (seed G-6), and no command goes to the
node: with on_stall: keep Slurm keeps the job running; with restart Slurm is asked to queue it
again (G-7's restart, as Slurm does it), or, its restarts spent, to cancel it."""

from __future__ import annotations

from datetime import timedelta

from backend.lifecycle.rules import check_timers
from backend.lifecycle.sentences import CONTAINER_RUNNING, EndCause
from backend.lifecycle.states import RUNNING, STARTING, Cause, Phase
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
    policy = RunPolicy(stall_timeout=timedelta(minutes=5), on_stall="keep")
    run = slurm_run(RUNNING, policy, [timedelta(minutes=1), timedelta(minutes=20)])
    fx = Effects()
    check_timers(run, T0 + timedelta(minutes=21), fx)
    stalled = [(t.worker_id, t.at, t.phase) for t in fx.transitions if t.worker_id]
    assert stalled == [(1, T0 + timedelta(minutes=1), Phase.STALLED)]
    assert run.workers[0].stalled_since == T0 + timedelta(minutes=1)
    assert (run.state, run.stop_cause, fx.commands) == (RUNNING, None, [])


def test_a_stall_that_restarts_slurms_run_asks_slurm_to_queue_it_again() -> None:
    """on_stall: restart: the Slurm import queues the job again, to begin at restart_at (the
    restart's wait, as for Astraeus's own runs), while the budget lasts, and cancels it after;
    the workers stay Slurm's, counted stalled; no command goes to the node."""
    now = T0 + timedelta(minutes=21)
    policy = RunPolicy(stall_timeout=timedelta(minutes=5), max_restarts=2)
    run = slurm_run(RUNNING, policy, [timedelta(minutes=1), timedelta(minutes=12)])
    fx = Effects()
    check_timers(run, now, fx)
    # rank 1, quiet for 9 minutes (over half the timeout), had stopped with it
    quiet_since = [T0 + timedelta(minutes=1), T0 + timedelta(minutes=12)]
    assert [w.stalled_since for w in run.workers] == quiet_since
    restart = (Cause.STALL, now + timedelta(seconds=10), 1)  # the first restart's wait
    assert (run.stop_cause, run.restart_at, run.failures_in_row) == restart
    assert run.reason == (
        "Restarting in 10s (1/2): Worker train-301-0 stalled on n1: no progress for 5m"
    )
    assert (run.state, run.cause, fx.commands) == (RUNNING, EndCause.STALLED, [])
    assert {w.state for w in run.workers} == {RUNNING}
    fx = Effects()
    check_timers(run, now + timedelta(minutes=1), fx)  # asked once: not again
    assert fx.transitions == [] and run.failures_in_row == 1

    spent = slurm_run(RUNNING, policy, [timedelta(minutes=1)])
    # two restarts in a row, each stalling within ten minutes of running
    spent.failures_in_row, spent.running_since = 2, now - timedelta(minutes=9)
    check_timers(spent, now, Effects())
    assert (spent.stop_cause, spent.restart_at) == (Cause.STALL, None)  # cancelled, failed
    assert (spent.reason, spent.cause) == (
        "Retry budget exhausted after 2/2 restarts",
        EndCause.RETRY_BUDGET,
    )
    never = slurm_run(
        RUNNING,
        RunPolicy(stall_timeout=policy.stall_timeout, restart_policy="never"),
        [timedelta(0)],
    )
    check_timers(never, now, Effects())
    assert (never.restart_at, never.reason) == (
        None,
        "Worker train-301-0 stalled on n1: no progress for 5m",
    )
