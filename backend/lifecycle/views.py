"""What a lifecycle rule is given and what it records: the views of a run and its workers,
the transitions and agent commands it produces (Effects), and the recording of a change of
state. Pure, as every lifecycle rule (lifecycle/rules.py): the service loads the views and
writes back what changed."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from backend.events import rules as events_rules
from backend.lifecycle.sentences import EndCause, stalled_sentence, workers_running
from backend.lifecycle.states import (
    ENDED_STATES,
    HELD_PHASES,
    PLACED_STATES,
    RUNNING,
    Phase,
    may_follow,
)


@dataclass
class WorkerView:
    id: int
    rank: int
    name: str
    gpus: int
    state: str
    reason: str
    phase: str
    machine_id: int | None = None
    machine_name: str | None = None
    gpu_ids: list[int] = field(default_factory=list)
    ready: bool = False
    stop_cause: str | None = None
    # What it waits for while preparing or pulling (a Wait), beside its reason.
    waits_for: str | None = None
    exit_code: int | None = None
    # The cause of its last failure snapshot (last_failure): its failure is classified by it.
    cause: str | None = None
    restarts: int = 0
    restart_at: datetime | None = None
    last_failure: dict[str, Any] | None = None
    progress_at: datetime | None = None
    stalled_since: datetime | None = None
    # The workload's own step counter, and how fast it moves (steps per second, smoothed).
    progress_step: int | None = None
    stepped_at: datetime | None = None
    progress_rate: float | None = None
    # The highest step it ever reported and its last checkpoint (all attempts), and after a
    # restart the step it must reach again: until then its work is done again (issue 23).
    reached_step: int | None = None
    checkpoint_step: int | None = None
    redo_until: int | None = None
    # Since when it has been well behind its gang's median pace.
    slow_since: datetime | None = None
    attempt: int = 0
    # Its GPUs' recent utilisation: its pace when the workload reports no progress. Written
    # by the samples' ingest, read here, never written back by the lifecycle.
    gpu_utilization: float | None = None
    # When its state last changed (its latest transition as recorded).
    since: datetime | None = None

    @property
    def placed(self) -> bool:
        return self.machine_id is not None

    @property
    def alive(self) -> bool:
        """Placed and not yet reported gone: it still holds its GPUs."""
        return self.placed and self.state in PLACED_STATES

    @property
    def held_gpus(self) -> int:
        return self.gpus if self.phase in HELD_PHASES else 0


@dataclass(frozen=True)
class IdleRule:
    """A run's idle policy: every GPU's utilization under ``below`` (0 to 1), each whole
    minute's mean, for ``window``; then ``action``: "stop" or "notify"."""

    below: float
    window: timedelta
    action: str = "stop"


@dataclass
class RunPolicy:
    """What the specification says about how the run starts, fails and ends."""

    restart_policy: str = "on_failure"
    max_restarts: int = 10
    time_limit: timedelta | None = None
    stall_timeout: timedelta | None = None
    on_stall: str = "restart"
    idle: IdleRule | None = None


@dataclass
class RunView:
    id: int
    name: str
    state: str
    reason: str
    policy: RunPolicy
    workers: list[WorkerView]
    attempt: int = 0
    failures_in_row: int = 0
    restart_at: datetime | None = None
    started_at: datetime | None = None
    running_since: datetime | None = None
    placed_at: datetime | None = None
    ended_at: datetime | None = None
    stop_cause: str | None = None
    stop_by: str | None = None
    # What it waits for while pending (the scheduler's) or preparing (its slowest worker's).
    waits_for: str | None = None
    # Why it failed, restarts or was preempted while its reason says so (an EndCause).
    cause: str | None = None
    first_failure: dict[str, Any] | None = None
    master_port: int | None = None
    # The Slurm job that runs it (backend/slurm/): Slurm starts, limits, requeues and ends it,
    # the import records that; the lifecycle only finds what the agents on the nodes see.
    slurm_job: str | None = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def placed(self) -> bool:
        return any(w.placed for w in self.workers)

    def worker(self, name: str) -> WorkerView:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(name)


@dataclass(frozen=True)
class Transition:
    """One recorded change: a run's (worker_id None) or a worker's state and phase."""

    run_id: int
    worker_id: int | None
    at: datetime
    state: str
    reason: str
    phase: str | None = None
    held_gpus: int = 0
    gpus: int = 0
    machine_id: int | None = None

    def rows(
        self,
        organization_id: int,
        workspace_id: int,
        run_name: str,
        worker_name: str | None,
        data: dict[str, Any],
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Its history row and the event that publishes it to the workspace (as StateTransition
        and Event take them), the event with ``data``."""
        transition = {
            "run_id": self.run_id,
            "worker_id": self.worker_id,
            "transition_at": self.at,
            "state": self.state,
            "reason": self.reason,
            "phase": self.phase,
            "held_gpus": self.held_gpus,
            "gpus": self.gpus,
            "machine_id": self.machine_id,
        }
        event = {
            "organization_id": organization_id,
            "workspace_id": workspace_id,
            "run_id": self.run_id,
            "run_name": run_name,
            "worker_name": worker_name,
            "kind": events_rules.kind_of(self.worker_id is not None, self.state),
            "state": self.state,
            "reason": self.reason,
            "data": data,
            "created_at": self.at,
        }
        return transition, event


@dataclass(frozen=True)
class Command:
    """What a machine's agent must do for one worker."""

    machine_id: int
    # The machine knows the worker by this id alone (names repeat across workspaces).
    worker_id: int
    worker_name: str
    kind: str  # start | release | stop | delete
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointSeen:
    """A worker's progress named a new checkpoint at ``at``; ``cost_s`` the pause in its steps
    around it (None: its pace not known yet)."""

    worker_id: int
    step: int
    at: datetime
    cost_s: float | None


@dataclass(frozen=True)
class Restarted:
    """A run placed again after its gang ended: from here it redoes the steps since its last
    checkpoint, up to the highest it had reached (either None: not reported)."""

    run_id: int
    attempt: int
    at: datetime
    reached_step: int | None
    checkpoint_step: int | None


@dataclass(frozen=True)
class Failed:
    """A worker's attempt that failed (or stalled) on its machine: why (an EndCause), with
    its exit code. The machines' health is counted from these."""

    worker_id: int
    machine_id: int
    at: datetime
    cause: str
    exit_code: int | None


@dataclass
class Effects:
    transitions: list[Transition] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    # Restarts (each opens a redo), and when a worker's step reached its run's again after one.
    restarts: list[Restarted] = field(default_factory=list)
    caught_up: list[datetime] = field(default_factory=list)
    failures: list[Failed] = field(default_factory=list)
    # Checkpoints the workers reported, each with its cost where it could be measured.
    checkpoints: list[CheckpointSeen] = field(default_factory=list)
    # Runs that gave room back: the scheduler should look again.
    freed: bool = False


@dataclass(frozen=True)
class Placement:
    machine_id: int
    machine_name: str
    gpu_ids: tuple[int, ...]


# -- recording ---------------------------------------------------------------------------------


def set_worker(
    fx: Effects,
    run: RunView,
    w: WorkerView,
    state: str,
    reason: str,
    phase: Phase | str,
    at: datetime,
    *,
    placing: bool = False,
    waits: str | None = None,
) -> None:
    """Record a worker's state, reason and phase; a change of state or phase is a transition.
    A worker whose attempt ended keeps its state or waits to be placed again, unless this is
    a new placement (may_follow)."""
    if not may_follow(w.state, state, placing=placing):
        return
    changed = (w.state, w.phase) != (state, str(phase))
    w.state, w.reason, w.phase, w.waits_for = state, reason, str(phase), waits
    if changed:
        if w.since is None or at > w.since:
            w.since = at
        fx.transitions.append(
            Transition(
                run_id=run.id,
                worker_id=w.id,
                at=at,
                state=state,
                reason=reason,
                phase=str(phase),
                held_gpus=w.held_gpus,
                gpus=w.gpus,
                machine_id=w.machine_id,
            )
        )


def running_reason(run: RunView) -> str:
    """A running run's sentence: how many of its workers run ("2 of 2 workers running"); while
    some of them stalled and run on (on_stall: keep), which and since when."""
    running = [w for w in run.workers if w.state == RUNNING]
    stalled = sorted((w for w in running if w.stalled_since is not None), key=lambda w: w.rank)
    if not stalled:
        return workers_running(len(running), len(run.workers))
    since = min(w.stalled_since for w in stalled if w.stalled_since is not None)
    return stalled_sentence([(w.name, w.machine_name) for w in stalled], since)


def set_run(
    fx: Effects,
    run: RunView,
    state: str,
    reason: str,
    at: datetime,
    cause: EndCause | str | None = None,
    *,
    waits: str | None = None,
) -> None:
    """Record a run's state, reason and cause; a change of state is a transition."""
    changed = run.state != state
    run.state, run.reason, run.cause, run.waits_for = state, reason, cause, waits
    if changed:
        fx.transitions.append(
            Transition(run_id=run.id, worker_id=None, at=at, state=state, reason=reason)
        )
