"""The agents domain's entry point: what a machine's stream brings, applied to the domains."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import counting as accounting
from backend.clock import Clock, SystemClock
from backend.gateway import repository
from backend.gateway.seen_lines import Seen
from backend.lifecycle import service as lifecycle
from backend.lifecycle.progress import worker_progress
from backend.lifecycle.sentences import EndCause
from backend.lifecycle.states import PLACED_STATES, RUNNING, Wait
from backend.lifecycle.views import CheckpointSeen, Effects, RunPolicy, RunView, WorkerView
from backend.machine_identity.rules import MachinePrincipal
from backend.machines import service as machines
from backend.machines.rules import SLURM, FaultKind
from backend.machines.service import GpuInfo
from backend.metrics import service as metrics_service
from backend.metrics.rules import SampleIn
from backend.models import AgentCommand, Machine

# What an agent reports, in the lifecycle's words.
EVENT_KINDS = {
    "preparing": "Preparing",
    "pulling": "Pulling",
    "ready": "ready",
    "running": "running",
    "exited": "exited",
}


# A worker the server placed, which the machine's agent no longer has (its data was lost).
LOST_BY_AGENT = "Lost: the agent on {machine} no longer has it"


@dataclass(frozen=True)
class KnownWorker:
    """A worker an agent says it has: running, at the barrier, or ended and not yet told."""

    worker_id: int
    attempt: int
    ended: bool


@dataclass(frozen=True)
class HelloInfo:
    machine: str
    pool: str | None
    cpu_cores: float
    memory_bytes: int
    gpus: list[GpuInfo]
    workers: tuple[KnownWorker, ...] = ()
    advertise_address: str = ""  # where other machines reach it (MASTER_ADDR)
    executor: str = "process"  # how its agent runs workers: "process" or "docker"
    unmeasured_metrics: tuple[str, ...] = ()  # what that executor cannot attribute to a worker
    # What of its workers' sandbox it enforces: {"enforced": [...], "pids_max": n}; None: an
    # agent before it said.
    isolation: dict[str, Any] | None = None


@dataclass(frozen=True)
class WorkerEventInfo:
    worker_id: int
    attempt: int | None
    kind: str  # preparing | pulling | ready | running | exited
    at: datetime
    reason: str  # what a preparing or pulling worker waited for, from an agent before waits
    exit_code: int | None
    log_tail: str
    # How it ended, when it exited: the sentence is the lifecycle's to write.
    cause: EndCause = EndCause.EXITED
    signal: int | None = None
    detail: str = ""
    # An end UNREADABLE's user id, and the folder it may not enter ("": the file itself).
    uid: int | None = None
    blocked_at: str = ""
    # Its process limit, when the limit refused it a process or a thread (with its end).
    pids_limit: int | None = None
    # What a preparing or pulling worker waits for, and its name: the sentence is the lifecycle's.
    waits: tuple[Wait, str] | None = None
    # An end PORT_TAKEN's port, held by its agent for the gang's next placement there.
    offered_port: int | None = None


def agent_time(ms: int, now: datetime) -> datetime:
    """An agent's timestamp, never later than the server's now (clocks drift)."""
    if ms <= 0:
        return now
    return min(datetime.fromtimestamp(ms / 1000, tz=UTC), now)


async def hello(
    session: AsyncSession, clock: Clock, agent: MachinePrincipal, info: HelloInfo, lease: timedelta
) -> Machine:
    machine = await machines.register(
        session,
        clock,
        cluster_id=agent.cluster_id,
        name=info.machine,
        cpu_cores=info.cpu_cores,
        memory_bytes=info.memory_bytes,
        gpus=info.gpus,
        lease=lease,
        pool=info.pool,
        address=info.advertise_address,
        executor=info.executor,
        unmeasured_metrics=info.unmeasured_metrics,
        isolation=info.isolation,
    )
    # Its agent is back with its own copies of its workers' lines: those seen are not needed.
    await lifecycle.forget_seen_lines(session, machine.id)
    return machine


async def reconcile(
    session: AsyncSession, clock: Clock, machine: Machine, known: tuple[KnownWorker, ...]
) -> tuple[list[int], Effects]:
    """After a Hello, agree with the agent on what runs there.

    The agent's workers that are no longer this machine's (their run moved on while the agent
    was away: lost lease, stopped, deleted) are to be stopped: their ids are returned. The
    workers this machine should have, which the agent had reported and no longer knows of,
    failed: their end is written with a sentence that says so. A Slurm node's agent runs no
    workers (Slurm does): there is nothing to agree on; it is sent what to watch (``watches``).
    """
    if machine.executor == SLURM:
        return [], Effects()
    placed = {w.id: w for w in await repository.workers_on_machine(session, machine.id)}
    to_stop = [
        k.worker_id
        for k in known
        if not k.ended
        and (
            (w := placed.get(k.worker_id)) is None
            or w.attempt != k.attempt
            or w.state not in PLACED_STATES
        )
    ]
    ids = {k.worker_id for k in known}
    total = Effects()
    for w in placed.values():
        if w.id in ids or w.state not in PLACED_STATES or not w.ready:
            continue
        fx = await lifecycle.report(
            session,
            clock,
            machine_id=machine.id,
            worker_id=w.id,
            kind="exited",
            attempt=w.attempt,
            cause=EndCause.LOST_BY_AGENT,
            detail=LOST_BY_AGENT.format(machine=machine.name),
        )
        total.freed |= fx.freed
    return to_stop, total


async def watches(session: AsyncSession, machine: Machine) -> list[AgentCommand]:
    """What a Slurm node's agent watches, sent again at each Hello (an agent that restarted
    knows nothing of them): the newest WATCH of each worker Slurm runs there now."""
    if machine.executor != SLURM:
        return []
    return await repository.watch_commands(session, machine.id)


async def renew_leases(
    session: AsyncSession, clock: Clock, heard: Mapping[int, datetime], lease: timedelta
) -> machines.Renewal:
    """The leases of the machines a replica heard from (each with when it was last heard),
    renewed at once: which were lost already, and which another transaction held (renewed
    next time)."""
    return await machines.renew_leases(session, clock, heard, lease)


async def keep_seen_lines(session: AsyncSession, seen: Sequence[Seen]) -> None:
    """The last lines a replica relayed of each worker (backend/gateway/seen_lines.py), kept for
    the snapshot of a worker whose machine is lost."""
    await lifecycle.keep_seen_lines(
        session, [(s.worker_id, s.machine_id, s.text, s.at) for s in seen]
    )


async def worker_event(
    session: AsyncSession, clock: Clock, machine_id: int, event: WorkerEventInfo
) -> Effects:
    fx = await lifecycle.report(
        session,
        clock,
        machine_id=machine_id,
        worker_id=event.worker_id,
        kind=EVENT_KINDS[event.kind],
        at=event.at,
        attempt=event.attempt,
        reason=None if event.kind == "exited" else event.reason or None,
        waits=None if event.kind == "exited" else event.waits,
        exit_code=event.exit_code,
        cause=event.cause,
        signal=event.signal,
        detail=event.detail,
        uid=event.uid,
        blocked_at=event.blocked_at,
        pids_limit=event.pids_limit,
        offered_port=event.offered_port,
        log_tail=event.log_tail,
    )
    if event.kind == "exited" and event.log_tail:
        # The end of an attempt its machine was lost for: its lines fill that snapshot.
        late = await lifecycle.late_snapshot(
            session,
            machine_id=machine_id,
            worker_id=event.worker_id,
            attempt=event.attempt,
            log_tail=event.log_tail,
        )
        if not late:  # a Slurm node's agent's lines of a worker Slurm ended there
            await lifecycle.slurm_snapshot(
                session, machine_id=machine_id, worker_id=event.worker_id, log_tail=event.log_tail
            )
    return fx


async def progress(
    session: AsyncSession,
    clock: Clock,
    machine_id: int,
    worker_id: int,
    attempt: int | None,
    step: int | None,
    at: datetime,
    *,
    checkpoint_step: int | None = None,
) -> Effects:
    """A workload's report (with its step, maybe its last checkpoint) or new output (without
    one): it is not stalled."""
    return await lifecycle.report(
        session,
        clock,
        machine_id=machine_id,
        worker_id=worker_id,
        attempt=attempt,
        kind="progress",
        at=at,
        step=step,
        checkpoint_step=checkpoint_step,
    )


@dataclass(frozen=True)
class ProgressInfo:
    """A progress report of a machine's worker (``progress``'s arguments)."""

    machine_id: int
    worker_id: int
    attempt: int | None
    step: int | None
    at: datetime
    checkpoint_step: int | None = None


@dataclass
class Leftovers:
    """What ``reports`` did not write, to be written alone (each waiting for its rows): the
    progress reports (their indexes) that change a worker's state or whose worker's row
    another transaction held, and the GPU utilisation of workers whose rows were held."""

    progress: list[int] = field(default_factory=list)
    utilization: dict[tuple[int, int], float] = field(default_factory=dict)


async def reports(
    session: AsyncSession,
    clock: Clock,
    progress: Sequence[ProgressInfo],
    metrics: Sequence[tuple[int, list[SampleIn]]],
) -> Leftovers:
    """Many machines' progress reports and sample batches, written as ``progress`` and
    ``metrics`` write them one by one, in a few statements for them all (issue 19: a report
    each loaded and locked its whole gang, at a thousand machines hundreds a second).

    The workers' rows are locked first, all at once and without waiting: rows another
    transaction holds are left to be written alone (``Leftovers``), so a batch of many
    machines never waits behind a scheduling pass or a gang's change, and never deadlocks with
    one. A report that only moves a running worker's progress (nearly all) is applied here by
    the lifecycle's own rule (progress.worker_progress) to its row; one that ends a stall (a
    transition) is left to the lifecycle's whole path. Reports of a worker not on that
    machine, of another attempt, or of a worker no longer running change nothing, as there."""
    left = Leftovers()
    means: dict[tuple[int, int], float] = {}
    for machine_id, samples in metrics:
        for worker_id, mean in gpu_utilization_means(samples).items():
            means[(machine_id, worker_id)] = mean
    rows = await repository.lock_free_workers(
        session, {p.worker_id for p in progress} | {w for _, w in means}
    )
    changed: dict[int, WorkerView] = {}
    checkpoints: list[tuple[int, CheckpointSeen]] = []  # (run, checkpoint) its reports named
    for index, p in enumerate(progress):
        row = rows.get(p.worker_id)
        if row is None:  # held by another transaction (or gone): the whole path decides
            left.progress.append(index)
            continue
        if row.machine_id != p.machine_id or (p.attempt is not None and p.attempt != row.attempt):
            continue
        if row.state != RUNNING or row.stop_cause:
            if p.step is not None and row.state in PLACED_STATES:
                left.progress.append(index)  # its last steps as it ends: for its run's rework
            continue
        if row.stalled_since is not None:  # no longer stalled: a transition of its gang
            left.progress.append(index)
            continue
        w = changed.get(row.id) or _progress_view(row)
        if w.redo_until is not None and p.step is not None and p.step >= w.redo_until:
            left.progress.append(index)  # its run redoes work no more: a change of its run's
            continue
        fx = Effects()
        worker_progress(_ALONE, w, p.at, fx, step=p.step, checkpoint_step=p.checkpoint_step)
        assert not fx.transitions and not fx.commands, "a running worker's progress only"
        assert not fx.restarts and not fx.caught_up, "a running worker's progress only"
        checkpoints.extend((row.run_id, c) for c in fx.checkpoints)
        changed[row.id] = w
    await repository.write_progress(
        session,
        [
            {"id": w.id, **{f: getattr(w, f) for f in repository.PROGRESS_FIELDS}}
            for w in changed.values()
        ],
    )
    lifecycle.keep_checkpoints(session, checkpoints)
    held = {key: mean for key, mean in means.items() if key[1] in rows}
    left.utilization = {key: mean for key, mean in means.items() if key[1] not in rows}
    stored = await metrics_service.ingest_many(session, metrics)
    await repository.record_gpu_utilizations(session, held)
    await accounting.machines_samples_arrived(
        session,
        clock,
        {m: _earliest_gpu_samples(samples) for m, samples in metrics if stored.get(m)},
    )
    return left


# The run a lone worker's progress is applied in: the rule changes a running, unstalled
# worker's progress fields alone, never its run (asserted above).
_ALONE = RunView(id=0, name="", state="", reason="", policy=RunPolicy(), workers=[])


def _progress_view(row: Any) -> WorkerView:
    return WorkerView(
        id=row.id,
        rank=row.rank,
        name=row.name,
        gpus=row.gpus,
        state=row.state,
        reason=row.reason,
        phase=row.phase,
        machine_id=row.machine_id,
        stop_cause=row.stop_cause,
        since=row.state_since,
        stalled_since=row.stalled_since,
        attempt=row.attempt,
        progress_at=row.progress_at,
        progress_step=row.progress_step,
        stepped_at=row.stepped_at,
        progress_rate=row.progress_rate,
        reached_step=row.reached_step,
        checkpoint_step=row.checkpoint_step,
        redo_until=row.redo_until,
    )


async def record_gpu_utilizations(
    session: AsyncSession, means: dict[tuple[int, int], float]
) -> None:
    """Workers' GPU utilisation left over by ``reports`` (their rows were held), written."""
    await repository.record_gpu_utilizations(session, means)


async def metrics(
    session: AsyncSession, machine_id: int, samples: list[SampleIn], clock: Clock | None = None
) -> int:
    """A batch of the machine's samples, stored for range queries (and the goodput tick); the
    workers' GPU utilisation kept as their pace for straggler detection. Samples of a minute
    the tick has counted already (kept by the agent while the server was away) make it count
    that minute again (issue 20)."""
    stored = await metrics_service.ingest(session, machine_id, samples)
    await repository.record_gpu_utilization(session, machine_id, gpu_utilization_means(samples))
    if stored:
        await accounting.samples_arrived(
            session, clock or SystemClock(), machine_id, _earliest_gpu_samples(samples)
        )
    return stored


def _earliest_gpu_samples(samples: Sequence[SampleIn]) -> dict[int, datetime]:
    """Each worker's earliest GPU utilisation sample (what the tick counts by), by id."""
    earliest: dict[int, datetime] = {}
    for s in samples:
        if s.metric == "task_gpu_utilization_ratio":
            at = datetime.fromtimestamp(s.at_ms / 1000, UTC)
            earliest[s.worker_id] = min(at, earliest.get(s.worker_id, at))
    return earliest


def gpu_utilization_means(samples: list[SampleIn]) -> dict[int, float]:
    """Each worker's mean GPU utilisation over a batch (all its GPUs, all its samples), by id."""
    sums: dict[int, list[float]] = {}
    for s in samples:
        if s.metric == "task_gpu_utilization_ratio":
            total = sums.setdefault(s.worker_id, [0.0, 0.0])
            total[0] += s.value
            total[1] += 1
    return {worker: total / count for worker, (total, count) in sums.items()}


async def gpu_health(
    session: AsyncSession,
    clock: Clock,
    machine: Machine,
    index: int,
    healthy: bool,
    reason: str,
    kind: FaultKind,
) -> Effects:
    if healthy:
        await machines.gpu_healthy(session, machine, index)
        return Effects()
    return await machines.gpu_fault(session, clock, machine, index, reason, kind=kind)


async def commands_to_send(
    session: AsyncSession, machine_id: int, after_id: int
) -> list[AgentCommand]:
    """Commands the agent has not acknowledged, newer than the last one sent on this stream."""
    return await repository.unacked_commands(session, machine_id, after_id)


async def new_commands(
    session: AsyncSession, last_sent: dict[int, int]
) -> dict[int, list[AgentCommand]]:
    """For all the machines whose streams a replica holds (each with the last command id its
    stream sent), the unacknowledged commands newer than that, by machine, in id order: two
    queries for them all, however many machines (the second only when there is something new)."""
    heads = await repository.unacked_command_heads(session, last_sent.keys())
    wanted = [c for m, c in heads if c > last_sent[m]]
    found: dict[int, list[AgentCommand]] = {}
    if wanted:
        for command in await repository.commands_by_id(session, wanted):
            found.setdefault(command.machine_id, []).append(command)
    return found


@dataclass(frozen=True)
class LastPlacement:
    """Where a worker was placed last: kept after it ends (it ran somewhere, issue 21)."""

    machine_id: int
    gpu_ids: list[int]


async def last_placements(
    session: AsyncSession, worker_ids: Sequence[int]
) -> dict[int, LastPlacement]:
    found = await repository.last_placements(session, worker_ids)
    return {w: LastPlacement(m, gpu_ids) for w, (m, gpu_ids) in found.items()}


async def acknowledge(session: AsyncSession, clock: Clock, machine_id: int, ids: list[int]) -> None:
    if ids:
        await repository.ack_commands(session, machine_id, ids, clock.now())


async def undeliverable(
    session: AsyncSession, clock: Clock, machine_id: int, command_id: int, reason: str
) -> Effects:
    """A command the machine's stream cannot carry is set aside (as if carried out, so the
    stream goes on with the next), and the worker it was for fails with ``reason``."""
    command = await repository.set_aside_command(session, machine_id, command_id, clock.now())
    if command is None or command.target_worker_id is None:
        return Effects()
    attempt = command.payload.get("attempt") if command.kind == "start" else None
    return await fail_worker(session, clock, machine_id, command.target_worker_id, attempt, reason)


async def fail_worker(
    session: AsyncSession,
    clock: Clock,
    machine_id: int,
    worker_id: int,
    attempt: int | None,
    reason: str,
) -> Effects:
    """The server ends a worker placed on this machine that cannot be started, saying why."""
    return await lifecycle.report(
        session,
        clock,
        machine_id=machine_id,
        worker_id=worker_id,
        kind="exited",
        attempt=int(attempt) if attempt else None,
        cause=EndCause.UNDELIVERABLE,
        detail=reason,
    )
