"""How a run and its workers move through their lives, and the sentence that explains each step.

Pure: plain dataclasses in, the same dataclasses changed and a list of effects out. No database,
no clock: every function is told the time. The service loads the views, calls a rule, and
writes back what changed together with the transitions and agent commands the rules record.

A run is a gang: its workers are placed together, start together at a barrier, and when one
fails for good the others are stopped ("the gang does not run without it").

The rules are in pieces, each importing only those below it (pyproject.toml's contracts):
states.py (states, phases, why a gang stops), sentences.py (the seed's sentences, EndCause),
views.py (the views, the effects, the recording of a change), starting.py (placing and
starting a gang), progress.py (pace, stragglers, stalls found), endings.py (exits, a gang's
failure, its stop, restarts, requeues, ends), stops.py (what stops a gang from outside: its
owner, its time limit, a preemption, a drain, the barrier, a lost machine; its deletion) and,
here, the rules that fire with time: the gang barrier, the time limit and stalls.
"""

from __future__ import annotations

from datetime import datetime

from backend.config import format_duration
from backend.lifecycle.endings import (
    BARRIER_TIMEOUT,
    end_run,
    stop_gang,
    stop_running,
    will_restart,
)
from backend.lifecycle.progress import find_stalls, find_stragglers, mark_stalled, stalled_by
from backend.lifecycle.sentences import (
    EndCause,
    budget_exhausted_sentence,
    restart_backoff,
    time_limit_sentence,
)
from backend.lifecycle.states import FAILED, PREPARING, PULLING, RUNNING, STARTING, Cause
from backend.lifecycle.stops import barrier_timed_out, time_limit_reached
from backend.lifecycle.views import Effects, RunView, WorkerView, running_reason, set_run

# When a stall stops its gang, a member quiet for this part of the stall timeout had stopped
# too (a rank hung in a collective waits for the one that hung first): stalled from its own
# last progress. A healthy worker shows progress far more often than its stall timeout.
STALLED_WITH_GANG = 0.5


def _stall_stops_gang(run: RunView, w: WorkerView, at: datetime, fx: Effects) -> None:
    """``on_stall: restart``: the gang stops because ``w`` stalled; members that had stopped
    with it are stalled from their own last progress too, not running until the stop."""
    timeout = run.policy.stall_timeout
    assert timeout is not None
    for other in stalled_by(run, at, timeout * STALLED_WITH_GANG):
        quiet = format_duration(at - other.progress_at) if other.progress_at else "a while"
        mark_stalled(run, other, f"Stalled with its gang: no progress for {quiet}", fx)
    quiet = format_duration(timeout)
    run.reason = f"Worker {w.name} stalled on {w.machine_name}: no progress for {quiet}"
    run.cause = None  # advice once it restarts or fails (its sentence then carries it)
    stop_running(run, at)
    stop_gang(run, Cause.STALL, None, f"Stopping: worker {w.name} stalled", at, fx)


def _stall_requeues_slurm_job(run: RunView, w: WorkerView, at: datetime, fx: Effects) -> None:
    """``on_stall: restart`` of a run Slurm runs: its job is to be queued again in Slurm, to
    start at ``restart_at`` (each restart doubles the wait, as for Astraeus's own runs: the
    Slurm import runs `scontrol requeue` and sets the job's begin time); past the run's restart
    budget, or with restart_policy never, the import cancels the job and the run fails. Members
    that had stopped with it are stalled too; all count stalled until Slurm ends the instance."""
    timeout = run.policy.stall_timeout
    assert timeout is not None
    for other in stalled_by(run, at, timeout * STALLED_WITH_GANG):
        quiet = format_duration(at - other.progress_at) if other.progress_at else "a while"
        mark_stalled(run, other, f"Stalled with its gang: no progress for {quiet}", fx)
    sentence = f"Worker {w.name} stalled on {w.machine_name}: no progress for "
    sentence += format_duration(timeout)
    restart = will_restart(run, Cause.STALL, at)
    stop_running(run, at)
    run.stop_cause, run.restart_at = Cause.STALL, None
    why = EndCause.STALLED
    if restart:
        run.failures_in_row += 1
        wait = restart_backoff(run.failures_in_row)
        run.restart_at = at + wait  # (Slurm's begin time, in place of its own 2 minutes)
        count = f"{run.failures_in_row}/{run.policy.max_restarts}"
        sentence = f"Restarting in {format_duration(wait)} ({count}): {sentence}"
    elif run.policy.restart_policy != "never" and run.policy.max_restarts:
        sentence, why = budget_exhausted_sentence(run.policy.max_restarts), EndCause.RETRY_BUDGET
    set_run(fx, run, run.state, sentence, at, why)


def check_timers(run: RunView, now: datetime, fx: Effects) -> None:
    """The rules that fire with time: the gang barrier, the time limit, stalls."""
    if run.ended:
        return
    if run.slurm_job is not None:
        # Slurm keeps its own time limit and starts the gang whole: what is Astraeus's to find
        # is what the agents on its nodes see, stalls (each counted from its last progress).
        find_stragglers(run, now)
        stalled = find_stalls(run, now, fx)
        if stalled and run.policy.on_stall == "restart" and run.stop_cause is None:
            _stall_requeues_slurm_job(run, stalled[0], now, fx)
        elif stalled and run.state == RUNNING and run.stop_cause is None:
            set_run(fx, run, RUNNING, running_reason(run), now)  # it runs on, stalled
        return
    limit = run.policy.time_limit
    if limit is not None and run.started_at is not None and now >= run.started_at + limit:
        if run.placed:
            time_limit_reached(run, now, fx)
        elif run.stop_cause is None:
            end_run(run, FAILED, time_limit_sentence(limit), now, fx, EndCause.TIME_LIMIT)
        return
    if run.stop_cause is not None:
        return
    if (
        run.state in (PREPARING, PULLING, STARTING)
        and run.placed_at is not None
        and now - run.placed_at >= BARRIER_TIMEOUT
    ):
        barrier_timed_out(run, now, fx)
        return
    find_stragglers(run, now)
    stalled = find_stalls(run, now, fx)  # every one of them, before any stops the gang
    if stalled and run.policy.on_stall == "restart":
        _stall_stops_gang(run, stalled[0], now, fx)
    elif stalled and run.state == RUNNING:
        set_run(fx, run, RUNNING, running_reason(run), now)  # it runs on, stalled: says so
