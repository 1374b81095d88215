"""Goodput accounting's entry point: the tick that counts workers' time into the ledgers.

The tick counts whole UTC minutes: everything before the last minute boundary that was not
counted yet (one minute normally; an hour after an outage). It adds to the hourly and daily
ledgers, keeps what it counted as intervals (the explanation of every ledger figure) and
moves its mark, in one transaction, so a retried, late, duplicated or concurrent tick never
counts a second twice nor skips one.

Each live worker has an open interval (goodput_open_intervals) that ends at the mark, with the
phase the tick last counted it in. A worker without a new transition stays in that phase: on
PostgreSQL one statement a minute counts all of them (categories, cells, intervals closed and
opened where the category changes), with no loop over workers. A worker with transitions not
counted yet is counted by the pure rules from its history, from the earliest of them: one
recorded after its time had been counted (a stall found after the fact and dated back to the
worker's last progress) takes back what was counted of that worker from then, and counts it
again (DESIGN §4, invariant 3). Samples that came after their minute was counted (an agent
sends what it kept while the server was away) are recounted the same way: ``samples_arrived``
asks for it, within ``rules.LATE_SAMPLES_WINDOW`` after the minute; and a worker winding
down is counted from its history too, its stop being productive for at most the grace
period (``rules.winding_down``). On SQLite every worker is counted the second way.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from backend.accounting import ledger_writes, repository, rules
from backend.accounting.rules import Category, Interval, PhaseChange
from backend.clock import Clock
from backend.models import GoodputInterval, GoodputOpenInterval

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TickResult:
    counted_from: datetime | None
    counted_until: datetime | None
    recounted_from: datetime | None = None
    workers: int = 0
    intervals: int = 0


def minute_floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


async def tick(session: AsyncSession, clock: Clock) -> TickResult:
    """Count every worker's time up to the last whole minute."""
    now = clock.now()
    mark = await repository.lock_mark(session, now)
    counted = mark.counted_until
    until = minute_floor(now) if counted is None else max(minute_floor(now), counted)
    pending = await repository.unaccounted(session, before=until)
    # Each worker with a transition not counted yet counts again from it (or from the mark).
    starts = {w: at if counted is None else min(at, counted) for w, at in pending.earliest.items()}
    from_history = set(pending.earliest)
    # Each worker whose samples came after its minute was counted, from that minute (as a
    # stall found late: its time from then is taken back and counted again).
    late = await repository.recounts(session)
    for worker_id, since in late.earliest.items():
        if counted is not None and since < counted:
            starts[worker_id] = min(since, starts.get(worker_id, since))
            from_history.add(worker_id)
    # Slurm-backed clusters whose import is behind: their jobs counted no further than its
    # last read; those that fell behind, read on or caught up, counted again from where they
    # were counted to.
    clips, again = await _import_horizons(session, counted, until)
    for worker_id, since in again.items():
        starts[worker_id] = min(since, starts.get(worker_id, since))
        from_history.add(worker_id)
    steady = counted is not None and counted < until and _dialect(session) == "postgresql"
    if counted is not None and counted < until and not steady:
        # Winding down is productive for at most the stop's grace period: counted from the
        # history, where the stop's time is, not carried on from the last count. (The steady
        # minute's statement finds them itself.)
        _wind_down(starts, from_history, await repository.winding_down(session), counted)
    if late.ids:
        await repository.recounted(session, late.ids)
        log.info(
            "goodput: %d workers counted again from %s: their samples came late",
            len(late.earliest),
            min(late.earliest.values()).isoformat(),
        )
    if counted is None or counted >= until:
        mark.counted_until = until
        if not starts:  # the first tick, or one that came twice: nothing to count
            return TickResult(None, until)
    recounted = min(
        (s for s in starts.values() if counted is not None and s < counted), default=None
    )
    counted_from = min([*starts.values(), *([counted] if counted is not None else [])])
    workers, intervals = 0, 0
    if steady:
        assert counted is not None
        # Workers without a change: set-based, minute by minute (one minute but after an outage).
        # Those it finds winding down, and orphans, are left as they are, then counted as above.
        orphans = 0
        for minute in _minutes(counted, until):
            done = await ledger_writes.count_steady_minute(
                session, minute, list(starts), rules.BUSY_UTILIZATION
            )
            workers, intervals = max(workers, done.workers), intervals + done.closed
            _wind_down(starts, from_history, done.winding_down, counted)
            orphans = max(orphans, done.orphans)
        if orphans:
            intervals += await _close_orphans(session, counted)
    else:
        intervals += await _close_orphans(session, counted)
    if counted is not None and counted < until and not steady:
        for worker_id in await repository.open_intervals(session):
            starts.setdefault(worker_id, counted)  # from its open interval, as above
    changed, written = await _count(session, starts, from_history, counted, until, clips)
    await repository.mark_accounted(session, pending.ids)
    mark.counted_until = until
    return TickResult(counted_from, until, recounted, workers + changed, intervals + written)


async def hold_mark(session: AsyncSession) -> datetime | None:
    """How far the tick has counted, with its mark held until the transaction ends: no tick
    counts meanwhile. A deletion calls it before it reads the time (``count_deleted``)."""
    return await repository.hold_mark(session)


async def count_deleted(
    session: AsyncSession, worker_ids: list[int], at: datetime, counted: datetime | None
) -> None:
    """Workers about to be deleted with their run at ``at``: their time since the tick last
    counted it is counted now, while their history still exists, and their intervals end at
    ``at``. (Otherwise the next tick would find neither worker nor history, and the time
    between the last tick and the deletion would be lost.)

    ``counted`` is what ``hold_mark`` answered, called before ``at`` was read: no
    tick has counted past ``at`` then, and none counts while the run goes."""
    pending = await repository.unaccounted_of(session, worker_ids)
    late = await repository.recounts(session, worker_ids)
    opened = await repository.open_intervals(session, worker_ids)
    until = at if counted is None else max(at, counted)
    starts = dict(pending.earliest)
    from_history = set(pending.earliest)
    if counted is not None:
        starts = {w: min(start, counted) for w, start in starts.items()}
        for worker_id, since in late.earliest.items():  # samples that came late, as in tick
            if since < counted:
                starts[worker_id] = min(since, starts.get(worker_id, since))
                from_history.add(worker_id)
        for worker_id in opened:
            starts.setdefault(worker_id, counted)
    starts = {w: start for w, start in starts.items() if start < until}
    if starts:
        clips = await repository.held_clusters(session)
        await _count(session, starts, from_history, counted, until, clips)
    await repository.mark_accounted(session, pending.ids)
    await repository.recounted(session, late.ids)
    left = await repository.open_intervals(session, worker_ids)
    await repository.add_intervals(session, [_closed_row(o, until) for o in left.values()])
    await repository.delete_open(session, list(left))


# Samples of a minute that come this soon after it are there before its tick counts it: the
# tick runs when the minute has ended, and an ingest takes milliseconds from the clock read
# to its commit. Any later, they may have been missed: the mark says.
SETTLE = timedelta(seconds=5)


async def samples_arrived(
    session: AsyncSession, clock: Clock, machine_id: int, earliest: dict[int, datetime]
) -> dict[int, datetime]:
    """One machine's ``machines_samples_arrived``."""
    return await machines_samples_arrived(session, clock, {machine_id: earliest})


async def machines_samples_arrived(
    session: AsyncSession, clock: Clock, earliest: dict[int, dict[int, datetime]]
) -> dict[int, datetime]:
    """Machines' GPU utilisation samples, just stored, the earliest of each worker, by
    machine: those of a minute the tick has counted already (the agent kept them while the
    server was away) make it count the worker again from that minute, if it ended at most
    ``rules.LATE_SAMPLES_WINDOW`` ago (older ones are kept, and not counted again); a worker's
    counts only from the machine it is placed on. Returns the recounts asked for.

    Read after the samples are written, with the tick's mark held shared: a tick under way is
    waited for and its mark read (it could not see these samples); a tick that starts later
    waits for this transaction, and sees them. The mark is read once for many machines' (a
    batch of the agent stream's writers, issue 40)."""
    now = clock.now()
    settled = minute_floor(now + SETTLE)
    maybe = {
        machine: found
        for machine, workers in earliest.items()
        if (found := {w: at for w, at in workers.items() if at < settled})
    }
    if not maybe:
        return {}
    counted = await repository.share_mark(session)
    if counted is None:
        return {}
    oldest = minute_floor(now) - rules.LATE_SAMPLES_WINDOW
    asked: dict[int, dict[int, datetime]] = {}
    for machine, workers in maybe.items():
        since = {w: max(minute_floor(at), oldest) for w, at in workers.items()}
        if since := {w: at for w, at in since.items() if at < counted}:
            asked[machine] = since
    if not asked:
        return {}
    placed = await repository.placed_on(session, {m: list(since) for m, since in asked.items()})
    recounts = {
        w: at
        for machine, since in asked.items()
        for w, at in since.items()
        if (w, machine) in placed
    }
    await repository.add_recounts(session, recounts)
    return recounts


async def _import_horizons(
    session: AsyncSession, counted: datetime | None, until: datetime
) -> tuple[dict[int, datetime], dict[int, datetime]]:
    """The clusters whose Slurm jobs are counted to their import's last read this tick (their
    import is behind), and the workers to count again, each from its moment: those of a
    cluster that fell behind since the last tick (what was counted past the read is taken
    back), that read on while behind, or that caught up (counted from where they were held)."""
    clips: dict[int, datetime] = {}
    since: dict[int, datetime] = {}
    for found in await repository.import_horizons(session):
        clip = rules.import_clip(found.read_at, until)
        if clip is not None:
            clips[found.cluster_id] = clip
        if clip == found.counted_to:
            continue
        moment = min(at for at in (clip, found.counted_to) if at is not None)
        if counted is not None:  # (each counted by the rules this once: not the steady way)
            since[found.cluster_id] = min(moment, counted)
        await repository.hold_cluster(session, found.cluster_id, clip)
        if clip is not None and found.counted_to is None:
            log.warning(
                "goodput: cluster %d's Slurm import last read at %s: its jobs are counted "
                "no further until it reads on",
                found.cluster_id,
                clip.isoformat(),
            )
    return clips, await repository.workers_since(session, since)


def _wind_down(
    starts: dict[int, datetime], from_history: set[int], workers: list[int], counted: datetime
) -> None:
    for worker_id in workers:
        starts.setdefault(worker_id, counted)
        from_history.add(worker_id)


def _minutes(start: datetime, end: datetime) -> list[datetime]:
    return [start + i * rules.MINUTE for i in range(int((end - start) / rules.MINUTE))]


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


async def _close_orphans(session: AsyncSession, counted: datetime | None) -> int:
    """Workers deleted with their run since the last tick: their open interval ends at the
    mark (their time until then was counted)."""
    gone = await repository.orphans(session)
    if not gone or counted is None:
        return 0
    await repository.add_intervals(session, [_closed_row(o, counted) for o in gone])
    await repository.delete_open(session, [o.worker_id for o in gone])
    return len(gone)


def _closed_row(o: GoodputOpenInterval, end: datetime) -> dict[str, object]:
    return {
        "worker_id": o.worker_id,
        "worker_name": o.worker_name,
        "run_id": o.run_id,
        "workspace_id": o.workspace_id,
        "cluster_id": o.cluster_id,
        "machine_id": o.machine_id,
        "pool_id": o.pool_id,
        "start_at": o.start_at,
        "end_at": end,
        "category": o.category,
        "held": o.held,
        "gpus": o.gpus,
    }


@dataclass(frozen=True)
class _Piece:
    """An interval of a worker, with the pool of its machine: a ledger's and a row's unit."""

    interval: Interval
    pool: int | None

    def continues(self, other: _Piece) -> bool:
        a, b = self.interval, other.interval
        return (
            a.end == b.start
            and (a.category, a.held, a.gpus, a.machine_id, self.pool)
            == (b.category, b.held, b.gpus, b.machine_id, other.pool)
            and rules.hour_floor(a.start) == rules.hour_floor(b.start)
        )


async def _count(
    session: AsyncSession,
    starts: dict[int, datetime],
    from_history: set[int],
    counted: datetime | None,
    until: datetime,
    clips: dict[int, datetime],
) -> tuple[int, int]:
    """Count the workers of ``starts``, each from its moment, one by one by the pure rules:
    those with transitions not counted yet (from their history; what was counted from their
    moment on is taken back first), and on SQLite every worker. A worker of a cluster in
    ``clips`` (its Slurm import behind) is counted to the cluster's moment only, and left
    without an open interval: the steady minute does not count it on. How many workers and
    intervals.
    """
    if not starts:
        return 0, 0
    ids = sorted(starts)
    opened = await repository.open_intervals(session, ids)
    # Winding down is bounded from the stop's time: always counted from the history.
    winding = {w for w, o in opened.items() if o.phase in rules.WINDING_DOWN}
    from_history = from_history | winding
    history = await repository.phase_histories(session, sorted(from_history), until)
    info = await repository.worker_info(session, ids)
    pools = await repository.machine_pools(session)
    busy = await repository.minute_utilization(session, ids, min(starts.values()), until)
    cells: dict[ledger_writes.CellKey, float] = defaultdict(float)
    back = {w: at for w, at in starts.items() if counted is not None and at < counted}
    for row in await repository.closed_intervals_after(session, back):
        part = _as_interval(row, start=max(row.start_at, back[row.worker_id]))
        _add(cells, part, row, row.pool_id, -1)
    await repository.cut_intervals(session, back)
    rows: list[dict[str, object]] = []
    still_open: list[dict[str, object]] = []
    for worker_id in ids:
        start = starts[worker_id]
        before = opened.get(worker_id)
        previous = None  # the interval that ends where this count starts, which it may extend
        if before is not None:
            assert counted is not None
            if start < counted:  # taken back from ``start``
                part = _as_interval(before, start=max(before.start_at, start), end=counted)
                _add(cells, part, before, before.pool_id, -1)
            if before.start_at < start:
                previous = _Piece(
                    _as_interval(before, start=before.start_at, end=start), before.pool_id
                )
        worker = info.get(worker_id)
        if worker_id in from_history:
            # An ended attempt is never counted open: its late stop is not in force.
            changes = rules.in_force(history.get(worker_id, []))
        elif before is not None:
            changes = [PhaseChange(start, before.phase, before.gpus, before.phase_machine_id)]
        else:
            changes = []
        if worker is None:  # deleted while the tick ran: its open interval ends where it was
            changes = []
            worker = repository.WorkerInfo("", 0, 0, 0)

        def utilisation(minute: datetime, _: datetime, w: int = worker_id) -> float | None:
            return busy.get((w, int(minute.timestamp()) * 1000))

        end = min(until, clips.get(worker.cluster_id, until))
        pieces = [
            _Piece(part, pools.get(part.machine_id) if part.machine_id is not None else None)
            for part in rules.intervals(changes, start, end, utilisation)
        ]
        for piece in pieces:
            _add(cells, piece.interval, worker, piece.pool, +1)
        if previous is not None and pieces and previous.continues(pieces[0]):
            first = pieces[0].interval
            pieces[0] = _Piece(
                Interval(
                    previous.interval.start,
                    first.end,
                    first.category,
                    first.held,
                    first.gpus,
                    first.machine_id,
                ),
                pieces[0].pool,
            )
        elif previous is not None and before is not None:
            rows.append(_row(previous, worker_id, _owner(before)))
        last = pieces[-1] if pieces and pieces[-1].interval.end == until else None
        in_force = [c for c in rules.in_force(changes) if c.at < until]
        for piece in pieces:
            if piece is last:
                still_open.append(_open_row(piece, worker_id, worker, in_force[-1]))
            else:
                rows.append(_row(piece, worker_id, worker))
    await repository.delete_open(session, list(opened))
    await repository.add_intervals(session, rows)
    await repository.add_open(session, still_open)
    await ledger_writes.add_to_hours(session, cells)
    return len(ids), len(rows)


def _owner(row: GoodputInterval | GoodputOpenInterval) -> repository.WorkerInfo:
    return repository.WorkerInfo(row.worker_name, row.run_id, row.workspace_id, row.cluster_id)


def _add(
    cells: dict[ledger_writes.CellKey, float],
    part: Interval,
    owner: repository.WorkerInfo | GoodputInterval | GoodputOpenInterval,
    pool: int | None,
    sign: int,
) -> None:
    """Add (or take back) an interval in the ledger cells it counts in: its run's, its
    workspace's, its machine's and pool's (where it held GPUs on one)."""
    if not isinstance(owner, repository.WorkerInfo):
        owner = _owner(owner)
    hour = rules.hour_floor(part.start)
    scopes = [("run", owner.run_id), ("workspace", owner.workspace_id)]
    if part.machine_id is not None:
        scopes.append(("machine", part.machine_id))
    if pool is not None:
        scopes.append(("pool", pool))
    for scope, scope_id in scopes:
        cell = (
            hour,
            owner.workspace_id,
            owner.cluster_id,
            scope,
            scope_id,
            part.category.value,
            part.held,
        )
        cells[cell] += sign * part.gpu_seconds


def _as_interval(
    row: GoodputInterval | GoodputOpenInterval, *, start: datetime, end: datetime | None = None
) -> Interval:
    if end is None:
        assert isinstance(row, GoodputInterval)
        end = row.end_at
    return Interval(start, end, Category(row.category), row.held, row.gpus, row.machine_id)


def _row(piece: _Piece, worker_id: int, owner: repository.WorkerInfo) -> dict[str, object]:
    part = piece.interval
    return {
        "worker_id": worker_id,
        "worker_name": owner.name,
        "run_id": owner.run_id,
        "workspace_id": owner.workspace_id,
        "cluster_id": owner.cluster_id,
        "machine_id": part.machine_id,
        "pool_id": piece.pool,
        "start_at": part.start,
        "end_at": part.end,
        "category": part.category.value,
        "held": part.held,
        "gpus": part.gpus,
    }


def _open_row(
    piece: _Piece, worker_id: int, owner: repository.WorkerInfo, phase: PhaseChange
) -> dict[str, object]:
    row = _row(piece, worker_id, owner)
    del row["end_at"]  # it ends at the mark
    return {**row, "phase": phase.phase, "phase_machine_id": phase.machine_id}
