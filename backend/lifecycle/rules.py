"""How a run and its workers move through their lives, and the sentence that explains each step.

Pure: plain dataclasses in, the same dataclasses changed and a list of effects out. No database,
no clock: every function is told the time. The service loads the views, calls a rule, and
writes back what changed together with the transitions and agent commands the rules record.

A run is a gang: its workers are placed together, start together at a barrier, and when one
fails for good the others are stopped ("the gang does not run without it").

The rules are in pieces, each importing only those below it (pyproject.toml's contracts):
states.py (states, phases, why a gang stops), sentences.py (the seed's sentences, EndCause),
views.py (the views, the effects, the recording of a change), starting.py (placing and
starting a gang), progress.py (pace, stragglers, stalls found), endings.py (exits, stops,
restarts, requeues, ends, deletion) and, here, the rules that fire with time: the gang
barrier, the time limit and stalls.
"""

from __future__ import annotations

from datetime import datetime

from backend.config import format_duration
from backend.lifecycle.endings import (
    BARRIER_TIMEOUT,
    barrier_timed_out,
    end_run,
    stop_gang,
    stop_running,
    time_limit_reached,
)
from backend.lifecycle.progress import find_stalls, find_stragglers, mark_stalled, stalled_by
from backend.lifecycle.sentences import EndCause, time_limit_sentence
from backend.lifecycle.states import FAILED, PREPARING, PULLING, RUNNING, STARTING, Cause
from backend.lifecycle.views import Effects, RunView, WorkerView

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


def worker_stalled(run: RunView, w: WorkerView, at: datetime, fx: Effects) -> None:
    """No progress for the stall timeout: stalled from its last progress, maybe restarted."""
    timeout = run.policy.stall_timeout
    if timeout is None or w.state != RUNNING or w.stop_cause or w.stalled_since is not None:
        return
    if w.progress_at is None:
        w.progress_at = at
    mark_stalled(run, w, f"Stalled: no progress for {format_duration(timeout)}", fx)
    if run.policy.on_stall == "restart":
        _stall_stops_gang(run, w, at, fx)


def check_timers(run: RunView, now: datetime, fx: Effects) -> None:
    """The rules that fire with time: the gang barrier, the time limit, stalls."""
    if run.ended:
        return
    if run.slurm_job is not None:
        # Slurm keeps its own time limit and starts the gang whole: what is Astraeus's to find
        # is what the agents on its nodes see (stalls are counted; Slurm keeps the job running).
        find_stragglers(run, now)
        find_stalls(run, now, fx)
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
