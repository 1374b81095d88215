"""Placing a gang and starting it together: every worker placed at once, prepared and pulled
by its agent, released from the barrier when all are ready; the run's state follows its slowest
worker. Pure, as every lifecycle rule (lifecycle/rules.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from backend.lifecycle.sentences import CONTAINER_RUNNING, starting_together
from backend.lifecycle.states import PREPARING, PULLING, RUNNING, STARTING, Phase, Wait
from backend.lifecycle.views import (
    Command,
    Effects,
    Placement,
    Restarted,
    RunView,
    WorkerView,
    running_reason,
    set_run,
    set_worker,
)


def place(
    run: RunView,
    placements: list[Placement],
    at: datetime,
    fx: Effects,
    *,
    master_port: int,
    start_payload: dict[str, Any],
    master_addr: str | None = None,
    gang_addresses: list[str] | None = None,
) -> None:
    """Put every worker of the gang on its machine at once and tell the agents to start them.
    ``master_addr`` is where the other machines reach rank 0's (its agent's advertised
    address); without one, its machine's name. ``gang_addresses``: the gang's machines'
    addresses, which alone reach rank 0's MASTER_PORT from other machines (agent/network.py)."""
    assert len(placements) == len(run.workers), "a gang is placed whole or not at all"
    run.attempt += 1
    run.placed_at = at
    run.restart_at = None
    run.first_failure = None
    run.stop_cause = run.stop_by = None
    run.running_since = None
    run.master_port = master_port
    phase = Phase.STARTING if run.attempt == 1 else Phase.RESTART
    if run.attempt > 1:
        _restarted(run, at, fx)
    master_addr = master_addr or placements[0].machine_name
    for w, p in zip(sorted(run.workers, key=lambda w: w.rank), placements, strict=True):
        w.machine_id, w.machine_name, w.gpu_ids = p.machine_id, p.machine_name, list(p.gpu_ids)
        w.ready, w.exit_code, w.stop_cause, w.restart_at = False, None, None, None
        w.stalled_since, w.progress_at = None, None
        w.progress_step = w.stepped_at = w.progress_rate = w.slow_since = None
        w.attempt = run.attempt
        set_worker(
            fx, run, w, STARTING, f"Placed on {p.machine_name}; starting", phase, at, placing=True
        )
        environment = {
            "RANK": str(w.rank),
            "WORLD_SIZE": str(len(run.workers)),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in p.gpu_ids),
            "ASTRAEUS_RUN": run.name,
            "ASTRAEUS_WORKER": w.name,
        }
        fx.commands.append(
            Command(
                machine_id=p.machine_id,
                worker_id=w.id,
                worker_name=w.name,
                kind="start",
                payload={
                    **start_payload,
                    "run": run.name,
                    "rank": w.rank,
                    "attempt": run.attempt,
                    "gpu_ids": list(p.gpu_ids),
                    "astraeus_environment": environment,
                    "gang_addresses": list(gang_addresses or []),
                },
            )
        )
    set_run(fx, run, STARTING, starting_together(0, len(run.workers)), at)


def _restarted(run: RunView, at: datetime, fx: Effects) -> None:
    """A restart: the run goes back to its last checkpoint (the latest any worker reported)
    and its work is done again until a worker reaches the highest step any had reached."""
    reached = max((w.reached_step for w in run.workers if w.reached_step is not None), default=None)
    checkpoint = max(
        (w.checkpoint_step for w in run.workers if w.checkpoint_step is not None), default=None
    )
    fx.restarts.append(Restarted(run.id, run.attempt, at, reached, checkpoint))
    for w in run.workers:
        w.redo_until = reached


def refresh_run(run: RunView, at: datetime, fx: Effects) -> None:
    """A placed gang's state follows its slowest worker; all running makes the run Running."""
    if run.stop_cause is not None or run.ended:
        return
    workers = run.workers
    total = len(workers)
    running = sum(1 for w in workers if w.state == RUNNING)
    if running == total:
        if run.running_since is None:
            run.running_since = at
        if run.started_at is None:
            run.started_at = at
        set_run(fx, run, RUNNING, running_reason(run), at)
        return
    for state in (PREPARING, PULLING):
        slow = next((w for w in workers if w.state == state), None)
        if slow is not None:
            set_run(fx, run, state, slow.reason, at, waits=slow.waits_for)
            return
    if running and run.state == RUNNING:
        set_run(fx, run, RUNNING, running_reason(run), at)
        return
    ready = sum(1 for w in workers if w.ready or w.state == RUNNING)
    set_run(fx, run, STARTING, starting_together(ready, total), at)


def is_current(run: RunView, w: WorkerView, attempt: int | None) -> bool:
    """A report about an earlier attempt, or a worker no longer placed, changes nothing."""
    return w.alive and (attempt is None or attempt == run.attempt)


def worker_preparing(
    run: RunView,
    w: WorkerView,
    state: str,
    reason: str,
    at: datetime,
    fx: Effects,
    *,
    attempt: int | None = None,
    waits: Wait | None = None,
) -> None:
    """The agent is preparing (credentials, drives) or pulling the image; the reason says what,
    ``waits`` (when its agent said it) what kind of thing it is."""
    assert state in (PREPARING, PULLING, STARTING)
    if not is_current(run, w, attempt) or w.stop_cause or w.ready or w.state == RUNNING:
        return  # late news: it is already past preparing and pulling
    set_worker(fx, run, w, state, reason, w.phase, at, waits=waits)
    refresh_run(run, at, fx)


def worker_ready(
    run: RunView, w: WorkerView, at: datetime, fx: Effects, *, attempt: int | None = None
) -> None:
    """Prepared and pulled: at the gang barrier. When all are, every agent is told to go."""
    if not is_current(run, w, attempt) or w.stop_cause or w.ready:
        return
    w.ready = True
    set_worker(fx, run, w, STARTING, "Ready; waiting for the rest of its gang", w.phase, at)
    if all(x.ready for x in run.workers):
        for x in run.workers:
            assert x.machine_id is not None
            fx.commands.append(
                Command(x.machine_id, x.id, x.name, "release", {"attempt": run.attempt})
            )
    refresh_run(run, at, fx)


def worker_running(
    run: RunView, w: WorkerView, at: datetime, fx: Effects, *, attempt: int | None = None
) -> None:
    if not is_current(run, w, attempt) or w.stop_cause or w.state == RUNNING:
        return  # a repeat (an agent reconnecting) is neither news nor progress
    w.ready = True
    w.progress_at = at
    set_worker(fx, run, w, RUNNING, CONTAINER_RUNNING, Phase.RUNNING, at)
    refresh_run(run, at, fx)
