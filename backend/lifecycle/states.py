"""A run's and its workers' states and phases, why a gang is stopped, and which state may
follow which: the words every lifecycle rule speaks. Pure, as every lifecycle rule
(lifecycle/rules.py)."""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    PENDING = "Pending"
    PREPARING = "Preparing"
    PULLING = "Pulling"
    STARTING = "Starting"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"
    DELETED = "Deleted"


class WorkerState(StrEnum):
    """A worker's states: a run's, but Deleted, and with Stopping while it winds down."""

    PENDING = "Pending"
    PREPARING = "Preparing"
    PULLING = "Pulling"
    STARTING = "Starting"
    RUNNING = "Running"
    STOPPING = "Stopping"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"


class Wait(StrEnum):
    """What a run or worker not yet started waits for, stored beside the reason that says it
    (runs.waits_for, workers.waits_for): the advice of runs/failures.py is chosen by it, never
    by reading the sentence. A restart's wait and the gang barrier are told by their states."""

    # a pending run, as the scheduler decided
    MACHINES = "machines"  # No machine fits … / Gang cannot be placed whole …
    QUEUE = "queue"  # Queued behind … / Next to run … / Waits for namespace quota …
    PLAN = "plan"  # Cannot plan workers …
    CONTAINERS = "containers"  # No machine runs containers …
    # a preparing or pulling worker (and its run, which says its slowest worker's), as its
    # machine's agent reported it
    SECRET = "secret"  # waiting for external secret …
    DRIVE = "drive"  # Waiting for drive … to be filled
    IMAGE = "image"  # Pulling image …
    CODE = "code"  # Fetching its code … (issue 41, --workdir)


ENDED_RUN_STATES = frozenset(
    {RunState.COMPLETED, RunState.FAILED, RunState.STOPPED, RunState.DELETED}
)


def is_ended(state: str) -> bool:
    return state in ENDED_RUN_STATES


class Phase(StrEnum):
    """Where a worker's GPU time goes now; goodput accounting reads the phases' intervals."""

    WAITING = "waiting"  # waiting for its first placement
    STARTING = "starting"  # placed, not yet running, first attempt
    RESTART = "restart"  # the same on a later attempt
    RUNNING = "running"  # productive or idle, by its GPUs' utilisation
    STALLED = "stalled"  # running while stalled, from its last progress
    STOPPING_OWNER = "stopping:owner"  # winding down when its owner asked
    STOPPING_TIME_LIMIT = "stopping:time_limit"  # winding down at its time limit
    STOPPING_IDLE = "stopping:idle"  # winding down after its idle policy stopped it: still idle
    STOPPING_PREEMPTION = "stopping:preemption"
    STOPPING_STALL = "stopping:stall"
    STOPPING_FAILURE = "stopping:failure"  # torn down with its gang after a failure
    REQUEUED_FAILURE = "requeued:failure"  # waiting to be placed again after a failure
    REQUEUED_PREEMPTION = "requeued:preemption"
    REQUEUED_STALL = "requeued:stall"
    # waiting to be placed again after Slurm's `scontrol requeue` for no cause it names (an
    # administrator's or the owner's; off a draining node it is a preemption): no one's loss
    REQUEUED_ADMIN = "requeued:admin"
    # waiting to be placed again after its gang's MASTER_PORT was found held by another
    # program (issue 37 N3): not the run's failure, held by no one
    REQUEUED_RENDEZVOUS = "requeued:rendezvous"
    ENDED = "ended"


HELD_PHASES = frozenset(
    {
        Phase.STARTING,
        Phase.RESTART,
        Phase.RUNNING,
        Phase.STALLED,
        Phase.STOPPING_OWNER,
        Phase.STOPPING_TIME_LIMIT,
        Phase.STOPPING_IDLE,
        Phase.STOPPING_PREEMPTION,
        Phase.STOPPING_STALL,
        Phase.STOPPING_FAILURE,
    }
)


class Cause(StrEnum):
    """Why a gang is being stopped."""

    OWNER = "owner"
    TIME_LIMIT = "time_limit"
    PREEMPTION = "preemption"  # stop_by: the run it makes room for
    DRAIN = "drain"  # a preemption by a drain; stop_by: the machine drained
    STALL = "stall"
    FAILURE = "failure"
    BARRIER = "barrier"
    RENDEZVOUS = "rendezvous"  # its MASTER_PORT was another program's (issue 37 N3)
    IDLE = "idle"  # its idle policy: its GPUs under the utilization for the window (issue 41)


# The states, by their names in runs/rules.py (a run's are a worker's but Stopping, plus Deleted).
PENDING = WorkerState.PENDING.value
PREPARING = WorkerState.PREPARING.value
PULLING = WorkerState.PULLING.value
STARTING = WorkerState.STARTING.value
RUNNING = WorkerState.RUNNING.value
STOPPING = WorkerState.STOPPING.value
COMPLETED = WorkerState.COMPLETED.value
FAILED = WorkerState.FAILED.value
STOPPED = WorkerState.STOPPED.value
DELETED = RunState.DELETED.value

PLACED_STATES = frozenset({PREPARING, PULLING, STARTING, RUNNING, STOPPING})
ENDED_STATES = frozenset({COMPLETED, FAILED, STOPPED, DELETED})
# A worker's attempt has ended: it holds nothing more until it is placed again.
WORKER_ENDED_STATES = frozenset({COMPLETED, FAILED, STOPPED})


def may_follow(state: str, next_state: str, *, placing: bool = False) -> bool:
    """Terminal states are terminal: a worker that completed, failed or stopped takes no
    further transition of its attempt. It may only wait to be placed again (Pending), keep
    its state while its run ends or is deleted (its phase becomes ended), or start a new
    attempt (``placing``). A stop, a report or a timer that comes after its end changes
    nothing (issue 19: a gang stop recorded after a worker's own failure held it forever)."""
    if placing or state not in WORKER_ENDED_STATES:
        return True
    return next_state in (state, PENDING)
