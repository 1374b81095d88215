"""Idle policies at work (issue 41): once a minute, after the goodput tick, each running run with
a policy is looked at over its window; one whose every GPU stayed under the utilization in each
of its whole minutes is stopped ("Stopped — idle: GPU utilization under 5% for 30 min", an event
and a webhook as every state change) or its workspace told (an event ``run.idle`` and its
webhook, once an idle spell). And what the policies did, for a workspace's page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.clock import Clock
from backend.config import parse_duration
from backend.db.commit_jobs import after_commit
from backend.errors import FieldError, InvalidInput
from backend.idle import repository, rules
from backend.job_names import PASS_JOB
from backend.lifecycle import service as lifecycle
from backend.lifecycle.sentences import idle_sentence
from backend.lifecycle.views import Effects
from backend.models import Event, IdleAction
from backend.organizations import service as organizations

IDLE_EVENT = "run.idle"
MAX_DAYS = 400  # as a goodput report's period


@dataclass(frozen=True)
class Checked:
    stopped: list[str]
    notified: list[str]


async def check(session: AsyncSession, clock: Clock) -> Checked:
    """Every running run with an idle policy, over the whole minutes of its window."""
    now = clock.now()
    stopped, notified, busy = [], [], []
    for run in await repository.candidates(session):
        policy = rules.Policy.stored(run.policy)
        start, end = rules.window_of(now, policy.window)
        idle = run.running_since is not None and run.running_since <= start
        if idle:
            workers = await repository.gpu_workers(session, run.id)
            means = await repository.gpu_minute_means(session, workers, start, end)
            idle = bool(workers) and rules.idle_throughout(means, workers, start, end, policy.below)
        if not idle:
            if run.notified_at is not None:
                busy.append(run.id)
            continue
        if policy.action == "stop":
            if await _stop(session, clock, run, policy, start):
                stopped.append(run.name)
        elif run.notified_at is None and await _notify(session, run, policy, start, now):
            notified.append(run.name)
    await repository.clear_notified(session, busy)
    return Checked(stopped, notified)


async def _stop(
    session: AsyncSession,
    clock: Clock,
    run: repository.Candidate,
    policy: rules.Policy,
    since: datetime,
) -> bool:
    done = await lifecycle.idle_stop(session, clock, run.id, since)
    if done is None:
        return False
    fx, at, gpus = done
    repository.add_action(session, _action(run, policy, "stop", at, since, gpus))
    _freed(session, fx)
    return True


async def _notify(
    session: AsyncSession,
    run: repository.Candidate,
    policy: rules.Policy,
    since: datetime,
    now: datetime,
) -> bool:
    if not await repository.mark_notified(session, run.id, now):
        return False
    sentence = idle_sentence(policy.below, policy.window)
    session.add(
        Event(
            organization_id=run.organization_id,
            workspace_id=run.workspace_id,
            run_id=run.id,
            run_name=run.name,
            kind=IDLE_EVENT,
            state="Running",
            reason=sentence[0].upper() + sentence[1:],
            data={"idle_since": since.isoformat(), "action": "notify"},
            created_at=now,
        )
    )
    gpus = 0  # told, not stopped: it gave nothing back
    repository.add_action(session, _action(run, policy, "notify", now, since, gpus))
    return True


def _action(
    run: repository.Candidate,
    policy: rules.Policy,
    action: str,
    at: datetime,
    since: datetime,
    gpus: int,
) -> IdleAction:
    limit = parse_duration(run.spec_time_limit) if run.spec_time_limit else None
    return IdleAction(
        run_id=run.id,
        workspace_id=run.workspace_id,
        run_name=run.name,
        action=action,
        at=at,
        idle_since=since,
        gpus=gpus,
        below=policy.below,
        window_s=int(policy.window.total_seconds()),
        limit_at=run.started_at + limit if limit and run.started_at else None,
    )


def _freed(session: AsyncSession, fx: Effects) -> None:
    if fx.freed:
        after_commit(session, PASS_JOB)  # its GPUs wait for another run


# -- what the policies did -----------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """One thing a run's idle policy did: ``stop`` or ``notify``."""

    run: str
    action: str
    at: datetime
    idle_since: datetime
    gpus: int
    reason: str
    gpu_hours_given_back: float


@dataclass(frozen=True)
class Report:
    """What a workspace's idle policies did over the last ``days``: the GPU-hours their stops
    gave back (each stopped run's GPUs, from its stop to now, or to its time limit), the
    GPU-hours those runs had held idle before (their windows), and each action."""

    since: datetime
    gpu_hours_given_back: float
    idle_gpu_hours_found: float
    runs_stopped: int
    actions: list[Done]


async def report(
    session: AsyncSession,
    clock: Clock,
    principal: Principal,
    days: int = 7,
    workspace: str | None = None,
) -> Report:
    if not 1 <= days <= MAX_DAYS:
        refused = FieldError("days", f"must be from 1 to {MAX_DAYS}")
        raise InvalidInput("INVALID_PARAMETER", [refused])
    ws = await organizations.workspace_for(session, principal, workspace)
    now = clock.now()
    since = now - timedelta(days=days)
    actions = await repository.actions_since(session, [ws.id], since)
    done = [
        Done(
            run=a.run_name,
            action=a.action,
            at=a.at,
            idle_since=a.idle_since,
            gpus=a.gpus,
            reason=_reason(a),
            gpu_hours_given_back=rules.given_back_hours(a.gpus, a.at, a.limit_at, now, since)
            if a.action == "stop"
            else 0.0,
        )
        for a in actions
    ]
    stops = [a for a in actions if a.action == "stop"]
    return Report(
        since=since,
        gpu_hours_given_back=sum(d.gpu_hours_given_back for d in done),
        idle_gpu_hours_found=sum(a.gpus * a.window_s / 3600 for a in stops),
        runs_stopped=len({a.run_id for a in stops}),
        actions=done,
    )


def _reason(action: IdleAction) -> str:
    sentence = idle_sentence(action.below, timedelta(seconds=action.window_s))
    if action.action == "stop":
        return f"Stopped — {sentence}"
    return sentence[0].upper() + sentence[1:]
