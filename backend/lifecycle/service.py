"""The lifecycle domain's entry point: what users ask (stop, delete), what agents report, what
time does; each loads its gang, applies a rule and persists what the rule decided (gangs.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from backend.clock import Clock
from backend.errors import Conflict
from backend.lifecycle import (
    endings,
    progress,
    repository,
    rules,
    sentences,
    starting,
    states,
    stops,
)
from backend.lifecycle.gangs import Gang, apply, load_gangs, persist
from backend.lifecycle.states import Wait
from backend.lifecycle.views import CheckpointSeen, Effects, RunView
from backend.models import (
    Run,
    Worker,
)


class DeletionLedger(Protocol):
    """The goodput ledgers as a deletion needs them (backend.accounting.counting is one): the
    tick's mark held before the time is read, then the doomed workers' time since the tick
    counted, while their history still exists. The caller, above both domains, hands it in:
    the lifecycle never imports the accounting that reads it."""

    async def hold_mark(self, session: AsyncSession) -> datetime | None: ...

    async def count_deleted(
        self, session: AsyncSession, worker_ids: list[int], at: datetime, counted: datetime | None
    ) -> None: ...


# -- what users ask ------------------------------------------------------------------------------


async def stop_run(session: AsyncSession, clock: Clock, run: Run, by: str) -> Effects:
    if run.state in states.ENDED_STATES:
        raise Conflict("RUN_ENDED", f"The run '{run.name}' has already ended ({run.state}).")
    _, fx, _ = await apply(
        session, run.id, clock.now(), lambda view, fx, at: stops.stop(view, by, at, fx)
    )
    return fx


async def idle_stop(
    session: AsyncSession, clock: Clock, run_id: int, idle_since: datetime
) -> tuple[Effects, datetime, int] | None:
    """Its idle policy found its GPUs idle since ``idle_since``: wind the gang down and end it
    Stopped. Under the gang's lock it must still be running whole since then, and not winding
    down for another cause; None where it is not. Else what it did, when, and the GPUs it held.
    """
    acted: list[int] = []

    def rule(view: RunView, fx: Effects, at: datetime) -> None:
        running = view.state == states.RUNNING and view.stop_cause is None
        if not running or view.running_since is None or view.running_since > idle_since:
            return
        acted.append(sum(w.held_gpus for w in view.workers))
        stops.idle_reached(view, at, fx)

    _, fx, at = await apply(session, run_id, clock.now(), rule)
    return (fx, at, acted[0]) if acted else None


async def delete_run(
    session: AsyncSession, clock: Clock, run: Run, by: str, *, ledger: DeletionLedger
) -> Effects:
    """Deleted: the run stays listed (runs -a); its workers and their logs are removed, once
    their GPU time up to now is counted into the goodput ledgers."""
    counted = await ledger.hold_mark(session)  # before now is read
    machines = await repository.machines_that_ran(session, run.id)

    def rule(view: RunView, fx: Effects, at: datetime) -> None:
        stops.delete(view, by, at, fx, machines=machines)

    gang, fx, at = await apply(session, run.id, clock.now(), rule)
    await repository.update_runs(session, {run.id: {"deleted_at": at}})
    await session.flush()
    await ledger.count_deleted(session, [w.id for w in gang.workers], at, counted)
    await repository.clear_pending_commands(session, [w.id for w in gang.workers], at)
    await repository.delete_workers(session, run.id)
    return fx


# -- what agents report --------------------------------------------------------------------------


async def report(
    session: AsyncSession,
    clock: Clock,
    *,
    machine_id: int,
    worker_id: int,
    kind: str,
    at: datetime | None = None,
    attempt: int | None = None,
    reason: str | None = None,
    waits: tuple[Wait, str] | None = None,
    cause: sentences.EndCause = sentences.EndCause.EXITED,
    signal: int | None = None,
    detail: str = "",
    uid: int | None = None,
    blocked_at: str = "",
    pids_limit: int | None = None,
    offered_port: int | None = None,
    exit_code: int | None = None,
    log_tail: str = "",
    step: int | None = None,
    checkpoint_step: int | None = None,
) -> Effects:
    """A worker's state as its machine's agent saw it: preparing, pulling, ready, running,
    progress, exited. A report for a worker the machine does not run (another machine's, or
    one moved on), or for an attempt other than the one it runs, changes nothing. ``waits``
    says what a preparing or pulling worker waits for and names it (``reason``: the sentence an
    agent from before it wrote); an end is its ``cause`` (with its exit code, signal, detail,
    and for an unreadable file the user and the folder in the way). The rules write the
    sentences."""
    if kind == "exited" and (reason is not None or waits is not None):
        raise ValueError("an end is reported as a cause, never as a sentence")
    if waits is not None:
        reason = sentences.waiting_sentence(*waits, detail)
    when = at or clock.now()
    worker = await repository.placed_worker(session, machine_id, worker_id)
    if worker is None or (attempt is not None and attempt != worker.attempt):
        return Effects()
    worker_name = worker.name

    def rule(view: RunView, fx: Effects, _: datetime) -> None:
        # Again under the run's lock: the worker was read before it, and may have been deleted
        # or moved on since (a report that raced its run's deletion failed the machine's stream).
        w = next((w for w in view.workers if w.name == worker_name), None)
        if w is None or w.machine_id != machine_id or attempt not in (None, w.attempt):
            return
        if view.slurm_job is not None and kind != "progress":
            # Slurm starts and ends its jobs' workers (the import records it): the agent on
            # the node, forged or not, says nothing of their state.
            return
        if kind in (states.PREPARING, states.PULLING):
            starting.worker_preparing(
                view,
                w,
                kind,
                reason or kind,
                when,
                fx,
                attempt=attempt,
                waits=waits[0] if waits is not None else None,
            )
        elif kind == "ready":
            starting.worker_ready(view, w, when, fx, attempt=attempt)
        elif kind == "running":
            starting.worker_running(view, w, when, fx, attempt=attempt)
        elif kind == "progress":
            progress.worker_progress(view, w, when, fx, step=step, checkpoint_step=checkpoint_step)
        elif kind == "exited":
            endings.worker_exited(
                view,
                w,
                when,
                fx,
                sentences.End(
                    cause,
                    exit_code,
                    signal,
                    detail,
                    uid,
                    blocked_at,
                    pids_limit,
                    offered_port=offered_port,
                ),
                log_tail=log_tail,
                attempt=attempt,
            )
        else:
            raise ValueError(f"unknown worker report: {kind}")

    _, fx, _ = await apply(session, worker.run_id, clock.now(), rule)
    if kind == "exited":  # its end came with its own last lines, if any
        await repository.forget_seen_lines(session, worker_id=worker_id)
    return fx


async def late_snapshot(
    session: AsyncSession,
    *,
    machine_id: int,
    worker_id: int,
    attempt: int | None,
    log_tail: str,
) -> bool:
    """A lost machine's agent, back, reports how its worker of the lost attempt ended, with its
    last lines (issue 20): they fill that attempt's failure snapshot, left without output when
    the machine was lost. Only that: the attempt is over, its state and accounting stay. Taken
    when the snapshot is a lost machine's, still without lines, and of this attempt on this
    machine (the worker's placements say which); whether it was."""
    if not log_tail or not attempt:
        return False

    async def taken(run: Run, worker: Worker, failure: dict[str, Any]) -> bool:
        if worker.cause != sentences.EndCause.MACHINE_LOST or not isinstance(
            failure.get("failed_at"), str
        ):
            return False
        placed = await repository.placements(
            session, worker_id, datetime.fromisoformat(failure["failed_at"])
        )
        return len(placed) == attempt and placed[-1] == machine_id

    return await _fill_snapshot(session, worker_id, log_tail, taken)


async def last_machine(session: AsyncSession, worker_id: int) -> int | None:
    """The machine the worker ran on last (it keeps its log), from its history."""
    return await repository.last_machine(session, worker_id)


async def slurm_snapshot(
    session: AsyncSession, *, machine_id: int, worker_id: int, log_tail: str
) -> bool:
    """A Slurm node's agent's last lines of a worker Slurm ended there (its job's output, as
    the agent copied it): they fill the failure snapshot, which Slurm's records leave without
    output. Taken when the worker is a Slurm run's, failed, its snapshot without lines, and it
    last held its GPUs on this machine; whether it was. Its state and accounting stay."""
    if not log_tail:
        return False

    async def taken(run: Run, worker: Worker, failure: dict[str, Any]) -> bool:
        if run.external_id is None or worker.state != states.FAILED:
            return False
        return await repository.last_machine(session, worker_id) == machine_id

    return await _fill_snapshot(session, worker_id, log_tail, taken)


async def _fill_snapshot(
    session: AsyncSession,
    worker_id: int,
    log_tail: str,
    taken: Callable[[Run, Worker, dict[str, Any]], Awaitable[bool]],
) -> bool:
    """A worker's failure snapshot left without lines filled with ``log_tail`` (its last 16
    KiB), where ``taken`` says these lines are that failure's; whether they were. Its run is
    locked first, as for every change of the gang."""
    await session.flush()  # what a report just changed is written first, never read over
    run_id = await repository.run_of_worker(session, worker_id)
    if run_id is None:
        return False
    run = (await repository.runs_by_id(session, [run_id], lock=True))[0]
    worker = await repository.worker_by_id(session, worker_id)
    failure = worker.last_failure if worker is not None else None
    if worker is None or not failure or failure.get("log_tail"):
        return False
    if not await taken(run, worker, failure):
        return False
    worker.last_failure = {**failure, "log_tail": endings.snapshot_output(log_tail)}
    return True


# -- what time does -------------------------------------------------------------------------------


async def check_timers(session: AsyncSession, clock: Clock) -> Effects:
    """Barriers, time limits and stalls of every live run, as of now."""
    now = clock.now()
    total = Effects()
    gangs = await load_gangs(session, await repository.live_run_ids(session))
    reads = await repository.slurm_reads(session) if gangs else {}
    for gang in gangs:
        fx = Effects()
        at = now
        if gang.view.slurm_job is not None:
            # As of what the import has read of Slurm: a job may have ended since, unread (its
            # output stops with it), and no stall is found past the import's horizon.
            at = min(now, reads.get(gang.run.cluster_id) or now)
        rules.check_timers(gang.view, at, fx)
        total.freed |= fx.freed
        await persist(session, gang, fx, now)
    return total


async def machine_lost(
    session: AsyncSession, clock: Clock, machine_id: int, silent_since: datetime | None = None
) -> Effects:
    """The machine is lost now; its workers failed when it went silent (``silent_since``, its
    last contact; now when it is not known), each with its failure snapshot."""
    now = clock.now()
    silent = min(silent_since or now, now)
    seen = await repository.seen_lines(session, machine_id)
    total = Effects()
    for gang in await load_gangs(session, await repository.run_ids_on_machine(session, machine_id)):
        fx = Effects()
        stops.machine_lost(gang.view, machine_id, silent, now, fx, _of_attempt(gang, seen))
        total.freed |= fx.freed
        await persist(session, gang, fx, now)
    await repository.forget_seen_lines(session, machine_id=machine_id)
    return total


def _of_attempt(gang: Gang, seen: dict[int, tuple[str, datetime]]) -> dict[int, str]:
    """The lines seen of the gang's workers in its current attempt (seen since it was placed:
    an earlier attempt's on the same machine are not its last)."""
    placed = gang.view.placed_at
    return {
        w.id: seen[w.id][0]
        for w in gang.view.workers
        if w.id in seen and (placed is None or seen[w.id][1] >= placed)
    }


def keep_checkpoints(session: AsyncSession, seen: Sequence[tuple[int, CheckpointSeen]]) -> None:
    """The checkpoints the writers' batches found in running workers' progress, (run, checkpoint)
    each: kept as a gang's own change keeps them (gangs.persist)."""
    for run_id, checkpoint in seen:
        repository.add_checkpoints(session, run_id, [checkpoint])


# The checkpoints kept: the advice measures a run's cost and interval over its last 30 days, as
# it measures its machines' failures (backend/accounting/checkpoint_advice.py).
CHECKPOINTS_KEPT = timedelta(days=30)


async def prune_checkpoints(session: AsyncSession, clock: Clock) -> int:
    """Checkpoints reported over CHECKPOINTS_KEPT ago deleted: how many."""
    return await repository.prune_checkpoints(session, clock.now() - CHECKPOINTS_KEPT)


async def keep_seen_lines(session: AsyncSession, seen: Sequence[repository.SeenRow]) -> None:
    """Each worker's last lines its machine's stream relayed (worker, machine, text, when):
    the failure snapshot they make should the machine be lost (``machine_lost``)."""
    if seen:
        await repository.keep_seen_lines(session, seen)


async def forget_seen_lines(session: AsyncSession, machine_id: int) -> None:
    """The machine's agent is back: it has its workers' lines itself."""
    await repository.forget_seen_lines(session, machine_id=machine_id)


async def machine_drained(
    session: AsyncSession, clock: Clock, machine_id: int, machine_name: str
) -> Effects:
    now = clock.now()
    total = Effects()
    for gang in await load_gangs(session, await repository.run_ids_on_machine(session, machine_id)):
        fx = Effects()
        at = gang.not_before_its_history(now)
        if not gang.view.ended and gang.view.placed:
            stops.drain_preempt(gang.view, machine_name, at, fx)
        total.freed |= fx.freed
        await persist(session, gang, fx, at)
    return total
