"""A gang as the lifecycle changes it: its rows loaded and locked, the view its rules change,
and what they changed written back from the difference — the transition (history, with the
accounting phase), the workspace event, the agent commands (an outbox) — in one transaction
(``load_gangs``, ``apply``, ``persist``)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncSession

from backend import ids
from backend.clock import iso_offset
from backend.db.bulk import insert_many
from backend.errors import Conflict, NotFound
from backend.events import rules as events_rules
from backend.lifecycle import repository, states
from backend.lifecycle.views import (
    Effects,
    IdleRule,
    RunPolicy,
    RunView,
    Transition,
    WorkerView,
)
from backend.models import (
    AgentCommand,
    Event,
    StateTransition,
    WorkerFailure,
)
from backend.spec import RunSpec, stored_spec

_RUN_FIELDS = (
    "state",
    "reason",
    "attempt",
    "failures_in_row",
    "restart_at",
    "started_at",
    "running_since",
    "placed_at",
    "ended_at",
    "stop_cause",
    "stop_by",
    "waits_for",
    "cause",
    "master_port",
)
_WORKER_FIELDS = (
    "state",
    "reason",
    "phase",
    "machine_id",
    "gpu_ids",
    "ready",
    "stop_cause",
    "waits_for",
    "cause",
    "exit_code",
    "restarts",
    "restart_at",
    "progress_at",
    "stalled_since",
    "attempt",
    "progress_step",
    "stepped_at",
    "progress_rate",
    "slow_since",
    "reached_step",
    "checkpoint_step",
    "redo_until",
)


@dataclass
class Gang:
    """A run and its workers as the database had them when they were locked (plain rows, each
    column an attribute; the run's with its workspace's ``organization_id``, each worker's
    with its machine's ``machine_name``), its stored specification, and the same as a view the
    rules change. What a rule changed is written from the difference (``persist``)."""

    run: Row[Any]
    workers: list[Row[Any]]
    spec: RunSpec
    view: RunView

    def not_before_its_history(self, now: datetime) -> datetime:
        """When a change read at ``now`` happens to the gang: ``now``, but never before the
        gang's last recorded change. A writer reads its clock before it locks what it changes;
        another writer that read its clock a moment later (another process, maybe another
        host) may have changed the gang and committed in between. Dated at ``now``, the change
        would come before what it follows: a worker placed before its run existed, a stop
        before the start it stops, and the ledgers counting that time twice or not at all
        (the production topology under load: 24 ms of GPU time over its held time,
        2026-12-05)."""
        recorded = [self.run.state_since, *(w.since for w in self.view.workers)]
        return max([now, *(at for at in recorded if at is not None)])


def policy_of(spec: RunSpec) -> RunPolicy:
    return RunPolicy(
        restart_policy=spec.restart_policy,
        max_restarts=spec.max_restarts,
        time_limit=spec.time_limit_delta,
        stall_timeout=spec.stall_timeout_delta,
        on_stall=spec.on_stall,
        idle=IdleRule(spec.idle.gpu_utilization_below / 100, spec.idle.window, spec.idle.action)
        if spec.idle is not None
        else None,
    )


def _worker_view(row: Row[Any]) -> WorkerView:
    # By key of the row's mapping: a Row's attribute costs 0.6 us, its mapping's key a tenth
    # (a first pass makes 3 455 workers' views of 30 columns).
    w = row._mapping
    failure = dict(w["last_failure"]) if w["last_failure"] else None
    if failure and isinstance(failure.get("failed_at"), str):
        failure["failed_at"] = datetime.fromisoformat(failure["failed_at"])
    return WorkerView(
        id=w["id"],
        rank=w["rank"],
        name=w["name"],
        gpus=w["gpus"],
        state=w["state"],
        reason=w["reason"],
        phase=w["phase"],
        machine_id=w["machine_id"],
        machine_name=w["machine_name"],
        gpu_ids=list(w["gpu_ids"] or []),
        ready=w["ready"],
        stop_cause=w["stop_cause"],
        waits_for=w["waits_for"],
        cause=w["cause"],
        exit_code=w["exit_code"],
        restarts=w["restarts"],
        restart_at=w["restart_at"],
        last_failure=failure,
        progress_at=w["progress_at"],
        stalled_since=w["stalled_since"],
        attempt=w["attempt"],
        progress_step=w["progress_step"],
        stepped_at=w["stepped_at"],
        progress_rate=w["progress_rate"],
        slow_since=w["slow_since"],
        reached_step=w["reached_step"],
        checkpoint_step=w["checkpoint_step"],
        redo_until=w["redo_until"],
        gpu_utilization=w["gpu_utilization"],
        since=w["state_since"],
    )


def _run_view(run: Row[Any], workers: list[Row[Any]], spec: RunSpec) -> RunView:
    values = run._mapping
    first = dict(values["first_failure"]) if values["first_failure"] else None
    if first and isinstance(first.get("at"), str):
        first["at"] = datetime.fromisoformat(first["at"])
    view = RunView(
        id=values["id"],
        name=values["name"],
        state=values["state"],
        reason=values["reason"],
        policy=policy_of(spec),
        workers=[_worker_view(w) for w in workers],
        first_failure=first,
        slurm_job=values["external_id"],
    )
    for name in _RUN_FIELDS:
        setattr(view, name, values[name])
    return view


async def load_gangs(
    session: AsyncSession, run_ids: Sequence[int], *, lock: bool = True
) -> list[Gang]:
    """The runs with their workers, locked for update so two passes never decide twice. What
    the session changed and did not write yet is written first: the rows read are its own."""
    if not run_ids:
        return []
    await session.flush()
    runs, workers = await repository.gang_rows(session, run_ids, lock=lock)
    gangs = []
    for run in runs:
        spec, rows = stored_spec(run.spec), workers.get(run.id, [])
        gangs.append(Gang(run, rows, spec, _run_view(run, rows, spec)))
    return gangs


async def load_gang(session: AsyncSession, run_id: int) -> Gang:
    gangs = await load_gangs(session, [run_id])
    if not gangs:
        raise NotFound("JOB_NOT_FOUND", "The run no longer exists.")
    return gangs[0]


def _json_safe(value: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if value is None:
        return None
    out = dict(value)
    if isinstance(out.get(key), datetime):
        out[key] = iso_offset(out[key])
    return out


def _changed(row: Row[Any], view: object, names: tuple[str, ...]) -> dict[str, Any]:
    """The view's fields that differ from the row's: those alone are written (a placing pass
    changes a few columns of thousands of rows). Compared as tuples first: most rows a rule
    is given it leaves as they were."""
    of_view, of_row = _FIELDS[names]
    new, old = of_view(view), of_row(row._mapping)
    if new == old:
        return {}
    return {n: v for n, v, was in zip(names, new, old, strict=True) if v != was}


_FIELDS: dict[tuple[str, ...], tuple[Callable[[Any], tuple[Any, ...]], ...]] = {
    names: (operator.attrgetter(*names), operator.itemgetter(*names))
    for names in (_RUN_FIELDS, _WORKER_FIELDS)
}


def _changes(gang: Gang, since: dict[int | None, datetime], writes: Writes) -> None:
    """What the rule changed of the run and of each worker, onto ``writes``; a new state with
    the time it was entered."""
    view = gang.view
    run = _changed(gang.run, view, _RUN_FIELDS)
    first = _json_safe(view.first_failure, "at")
    if first != gang.run.first_failure:
        run["first_failure"] = first
    if None in since and since[None] != gang.run.state_since:
        run["state_since"] = since[None]
    if run:
        writes.runs.setdefault(gang.run.id, {}).update(run)
    by_id = {w.id: w for w in gang.workers}
    for wv in view.workers:
        row = by_id[wv.id]
        worker = _changed(row, wv, _WORKER_FIELDS)
        last = _json_safe(wv.last_failure, "failed_at")
        if last != row.last_failure:
            worker["last_failure"] = last
        if wv.id in since and since[wv.id] != row.state_since:
            worker["state_since"] = since[wv.id]
        if worker:
            writes.workers.setdefault(wv.id, {}).update(worker)


@dataclass
class Writes:
    """New history, event and command rows, gathered over many gangs and inserted together."""

    transitions: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    # The columns changed of each run and worker, by id.
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    workers: dict[int, dict[str, Any]] = field(default_factory=dict)

    async def flush(self, session: AsyncSession) -> None:
        await repository.update_runs(session, self.runs)
        await repository.update_workers(session, self.workers)
        await insert_many(session, StateTransition, self.transitions)
        await insert_many(session, Event, self.events)
        await insert_many(session, AgentCommand, self.commands)
        await insert_many(session, WorkerFailure, self.failures)
        self.transitions, self.events, self.commands, self.failures = [], [], [], []
        self.runs, self.workers = {}, {}


async def persist(
    session: AsyncSession, gang: Gang, fx: Effects, at: datetime, writes: Writes | None = None
) -> None:
    """Write the view back to its rows, and each transition, event and command beside them.

    With ``writes``, the new rows wait there for one insert of many gangs' rows."""
    batch = writes if writes is not None else Writes()
    workers = {w.id: w for w in gang.workers}
    last_state: dict[int | None, str] = {None: gang.run.state}
    last_state.update((w.id, w.state) for w in gang.workers)
    since: dict[int | None, datetime] = {}
    for t in fx.transitions:
        if t.state != last_state.get(t.worker_id):
            since[t.worker_id] = t.at
            last_state[t.worker_id] = t.state
        worker = workers.get(t.worker_id) if t.worker_id is not None else None
        _add_history(batch, gang, worker.name if worker is not None else None, t, at)
    await _guard_ended(session, gang)
    _changes(gang, since, batch)
    # a start names the worker on its machine by its opaque id (backend/ids.py): its folder,
    # control group and user id, which its workload sees, count nothing (issue 37 N8)
    codec = (
        await ids.session_codec(session) if any(c.kind == "start" for c in fx.commands) else None
    )
    batch.commands.extend(
        {
            "machine_id": c.machine_id,
            # A delete command outlives the worker's row: only its target id stays.
            "worker_id": c.worker_id if c.kind != "delete" else None,
            "target_worker_id": c.worker_id,
            "worker_name": c.worker_name,
            "kind": c.kind,
            "payload": c.payload
            if codec is None or c.kind != "start"
            else {**c.payload, "worker_key": codec.show(ids.Kind.WORKER, c.worker_id)},
            "created_at": at,
        }
        for c in fx.commands
    )
    for restart in fx.restarts:
        await repository.restarted(session, gang.run.workspace_id, restart)
    if fx.caught_up:
        await repository.caught_up(session, gang.run.id, min(fx.caught_up))
    repository.add_checkpoints(session, gang.run.id, fx.checkpoints)
    batch.failures.extend(
        {
            "machine_id": f.machine_id,
            "cluster_id": gang.run.cluster_id,
            "workspace_id": gang.run.workspace_id,
            "run_id": gang.run.id,
            "worker_id": f.worker_id,
            "at": f.at,
            "cause": f.cause,
            "exit_code": f.exit_code,
        }
        for f in fx.failures
    )
    fx.transitions.clear()
    fx.commands.clear()
    fx.restarts.clear()
    fx.caught_up.clear()
    fx.failures.clear()
    fx.checkpoints.clear()
    if writes is None:
        await batch.flush(session)


async def _guard_ended(session: AsyncSession, gang: Gang) -> None:
    """The rules never move a worker out of an ended attempt (states.may_follow); the database
    says so too: each worker's new state of the same attempt is written only where that
    attempt has not ended, else the whole change is refused (its transaction rolls back)."""
    by_id = {w.id: w for w in gang.workers}
    moves = [
        (wv.id, wv.attempt, wv.state)
        for wv in gang.view.workers
        if (row := by_id[wv.id]).state != wv.state
        and row.attempt == wv.attempt  # a new attempt (a placement) starts afresh
        and wv.state != states.PENDING  # waiting to be placed again follows an end
    ]
    if moves and await repository.move_workers(session, moves) != len(moves):
        raise Conflict(
            "WORKER_ENDED",
            f"A worker of the run '{gang.run.name}' has already ended: its attempt takes no "
            "further transition.",
        )


def _add_history(
    batch: Writes, gang: Gang, worker_name: str | None, t: Transition, found: datetime
) -> None:
    # a stall is dated from the last progress, found later: both times kept (issue 21)
    data = events_rules.event_data(t.phase, t.at, found)
    transition, event = t.rows(
        gang.run.organization_id, gang.run.workspace_id, gang.run.name, worker_name, data
    )
    batch.transitions.append(transition)
    batch.events.append(event)


async def apply(
    session: AsyncSession,
    run_id: int,
    now: datetime,
    rule: Callable[[RunView, Effects, datetime], None],
) -> tuple[Gang, Effects, datetime]:
    """Load one gang, let a rule change it at ``now`` (never before the gang's last recorded
    change: ``Gang.not_before_its_history``), persist the result. Returns the time it used."""
    gang = await load_gang(session, run_id)
    at = gang.not_before_its_history(now)
    fx = Effects()
    rule(gang.view, fx, at)
    await persist(session, gang, fx, at)
    return gang, fx, at
