"""Goodput accounting, pure: where a worker's GPU time went, interval by interval.

The lifecycle records every change of a worker's accounting phase with its time and GPUs
(state_transitions). Here a worker's phases over a window become intervals, each in one of
the seed's categories, held or not:

| category   | the worker was                                                   | held?         |
|------------|------------------------------------------------------------------|---------------|
| productive | running, its GPUs busy (5% or more); or winding down when its    | yes           |
|            | owner asked (a stop, its time limit), for at most the stop's     |               |
|            | grace period, and only after it ran (see ``winding_down``)      |               |
| idle       | running, its GPUs idle                                           | yes           |
| stalled    | running while stalled; stopping because it stalled; waiting to   | while placed  |
|            | be placed again after                                            |               |
| starting   | placed, not yet running, on its first attempt                    | yes           |
| restart    | the same on a later attempt                                      | yes           |
| failure    | failed or lost and still holding its GPUs; waiting to be placed  | while placed  |
|            | again after a failure, a lost machine or a GPU fault             |               |
| preemption | stopping for higher-priority work or a drain; waiting to be      | while placed  |
|            | placed again after                                               |               |
| waiting    | waiting for its first placement; waiting to be placed again      | no            |
|            | after its gang's MASTER_PORT was another program's (issue 37 N3) |               |

Every interval counts its length times the GPUs the worker asked for (it holds them, or
waits for them). Running intervals are cut at UTC minutes and classified by the mean GPU
utilisation of their minute; every interval is cut at UTC hours (the ledgers' unit).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from backend.lifecycle.states import HELD_PHASES, Phase
from backend.metrics.rules import BadTime, parse_time  # the same time forms as /metrics/range

BUSY_UTILIZATION = 0.05  # "its GPUs busy (5% or more)"
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
# A stop's grace period: the agent sends SIGTERM, then SIGKILL after it (agent/executor.py's
# STOP_GRACE_SECONDS; Docker's stop is given the same). Winding down is productive for at most
# this long.
STOP_GRACE = timedelta(seconds=10)
# Samples that arrive after the tick counted their minute (an agent keeps them while the server
# is away and sends them when it is back) make it count the minute again, when they arrive
# within this long after the minute: older ones are stored, not recounted.
LATE_SAMPLES_WINDOW = timedelta(minutes=10)
# A Slurm-backed cluster's import is behind when its last read is older than this before what
# the tick counts (it reads every 30 s by default): its Slurm jobs are then counted no further
# than that read, the import's horizon, until it reads on (issue 38 F3). Within it they are
# counted on in their last phase, as any worker; what the import then dates earlier is
# counted again from its time.
IMPORT_BEHIND = timedelta(minutes=2)


def import_clip(read_at: datetime | None, until: datetime) -> datetime | None:
    """How far a Slurm-backed cluster's jobs are counted when the tick counts to ``until``
    and the import last read at ``read_at`` (None: never): its horizon when it is behind,
    else None (as any worker's)."""
    if read_at is None or read_at >= until - IMPORT_BEHIND:
        return None
    return read_at


class Category(StrEnum):
    PRODUCTIVE = "productive"
    IDLE = "idle"
    STALLED = "stalled"
    STARTING = "starting"
    RESTART = "restart"
    FAILURE = "failure"
    PREEMPTION = "preemption"
    WAITING = "waiting"


CATEGORIES = tuple(Category)  # iterating the enum itself is slow: a report makes 20 000 ledgers
CATEGORY_BY_VALUE = {c.value: c for c in Category}


# A phase's category and whether its GPUs are held; RUNNING is productive or idle by its
# utilisation, decided per minute.
_BY_PHASE: dict[str, tuple[Category, bool]] = {
    Phase.WAITING: (Category.WAITING, False),
    Phase.STARTING: (Category.STARTING, True),
    Phase.RESTART: (Category.RESTART, True),
    Phase.STALLED: (Category.STALLED, True),
    Phase.STOPPING_OWNER: (Category.PRODUCTIVE, True),
    Phase.STOPPING_TIME_LIMIT: (Category.PRODUCTIVE, True),
    # Its idle policy stopped it: its GPUs were idle, and idle they wind down.
    Phase.STOPPING_IDLE: (Category.IDLE, True),
    Phase.STOPPING_PREEMPTION: (Category.PREEMPTION, True),
    Phase.STOPPING_STALL: (Category.STALLED, True),
    Phase.STOPPING_FAILURE: (Category.FAILURE, True),
    Phase.REQUEUED_FAILURE: (Category.FAILURE, False),
    Phase.REQUEUED_PREEMPTION: (Category.PREEMPTION, False),
    Phase.REQUEUED_STALL: (Category.STALLED, False),
    # Another program held its gang's rendezvous port: nobody's failure, the run's least of all.
    Phase.REQUEUED_RENDEZVOUS: (Category.WAITING, False),
    # Queued again in Slurm for no cause it names (`scontrol requeue`): asked for, not held.
    Phase.REQUEUED_ADMIN: (Category.WAITING, False),
}


@dataclass(frozen=True, order=True)
class PhaseChange:
    """A worker entered ``phase`` at ``at``, asking for ``gpus`` (on ``machine_id`` if placed)."""

    at: datetime
    phase: str
    gpus: int
    machine_id: int | None = None


@dataclass(frozen=True)
class Interval:
    """Part of a worker's time in one category: [start, end) times its GPUs."""

    start: datetime
    end: datetime
    category: Category
    held: bool
    gpus: int
    machine_id: int | None

    @property
    def gpu_seconds(self) -> float:
        return (self.end - self.start).total_seconds() * self.gpus


# The mean utilisation of a worker's GPUs over [start, end), None when nothing was sampled.
Utilization = Callable[[datetime, datetime], float | None]


def _boundaries(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """The UTC multiples of ``step`` strictly inside (start, end)."""
    epoch = datetime(1970, 1, 1, tzinfo=start.tzinfo)
    first = epoch + ((start - epoch) // step + 1) * step
    out = []
    moment = first
    while moment < end:
        out.append(moment)
        moment += step
    return out


def _cut(start: datetime, end: datetime, step: timedelta) -> list[tuple[datetime, datetime]]:
    points = [start, *_boundaries(start, end, step), end]
    return list(itertools.pairwise(points))


def classify(phase: str, busy: float | None) -> tuple[Category, bool] | None:
    """A phase's category and held flag; None for a phase that is not counted (ended)."""
    if phase == Phase.RUNNING:
        return (
            Category.PRODUCTIVE if busy is not None and busy >= BUSY_UTILIZATION else Category.IDLE
        ), True
    return _BY_PHASE.get(phase)


# The phases that place a worker anew: the only held phases that may follow one that holds
# nothing (a failure, a stop, an end, a wait to be placed again).
_PLACING = frozenset({Phase.STARTING, Phase.RESTART})


def in_force(changes: Iterable[PhaseChange]) -> list[PhaseChange]:
    """A worker's phase changes in time order, but those of an attempt that had ended.

    Terminal states are terminal: once a worker holds nothing (it failed, stopped, completed
    or waits to be placed again), only a new placement makes it hold GPUs again. A gang stop
    recorded before a late report of the worker's own, earlier exit (rank 1's exit at .376
    stops rank 0, whose exit at .246 is reported after) happened after the worker had ended:
    it is not counted, else the worker would count as held forever (issue 19)."""
    out: list[PhaseChange] = []
    ended = False
    for change in sorted(changes):
        holds = change.phase in HELD_PHASES
        if holds and ended and change.phase not in _PLACING:
            continue
        # Waiting for a first placement ends nothing: only a worker's exit, or its gang's
        # requeue after one, ends an attempt.
        ended = not holds and change.phase != Phase.WAITING
        out.append(change)
    return out


# Winding down when its owner asked: productive (the seed's G-4), but bounded.
WINDING_DOWN = frozenset({Phase.STOPPING_OWNER, Phase.STOPPING_TIME_LIMIT})
# A stop not done after its grace period: the process was killed (SIGKILL) at its end, and the
# GPUs stay held until the stop is reported done. The seed names this time: "GPUs held and not
# used" (what goodput counts as a loss besides failures, preemptions and stalls), and idle is
# the category of GPUs held and not used ("running, its GPUs idle"). Not failure: nothing
# failed, the owner asked for the stop; should the machine be lost meanwhile, its lease's
# expiry records the failure, from then on. Not a lifecycle phase: the accounting's own.
OVERDUE = "stopping:overdue"
_BY_PHASE[OVERDUE] = (Category.IDLE, True)
_RAN = frozenset({Phase.RUNNING, Phase.STALLED})


def winding_down(
    changes: Sequence[PhaseChange], grace: timedelta = STOP_GRACE
) -> list[PhaseChange]:
    """A worker's phase changes in force (``in_force``), its winding down bounded.

    Winding down counts as productive only while the process lives, and at most for the
    stop's grace period (issue 20: a stop that never completed counted as productive for
    ever, 27 s for a worker that never ran):

    - an attempt that never ran (placed, stopped before it was running) has no process to
      wind down: its stop counts as what it was, placed and not yet running ("starting" on
      its first attempt, "restart" on a later one, the seed's G-8 and G-9);
    - one that ran is productive from the stop for at most ``grace``; its process ends at the
      worker's exit (the next change: its end, recorded at the process's own end time), and
      if it has not by then, it is counted idle (``OVERDUE``) until it has."""
    out: list[PhaseChange] = []
    placed: str | None = None  # the placing phase of the attempt in force
    ran = False
    for change, following in zip(changes, [*changes[1:], None], strict=True):
        if change.phase in _PLACING:
            placed, ran = change.phase, False
        elif change.phase in _RAN:
            ran = True
        if change.phase not in WINDING_DOWN:
            out.append(change)
            continue
        if not ran:
            out.append(
                PhaseChange(change.at, placed or Phase.STARTING, change.gpus, change.machine_id)
            )
            continue
        out.append(change)
        overdue = change.at + grace
        if following is None or following.at > overdue:
            out.append(PhaseChange(overdue, OVERDUE, change.gpus, change.machine_id))
    return out


def intervals(
    changes: Sequence[PhaseChange],
    start: datetime,
    end: datetime,
    utilization: Utilization = lambda a, b: None,
) -> list[Interval]:
    """A worker's intervals in [start, end), from its phase changes (all of them, any order).

    The phase in force at ``start`` is the last change at or before it; time before the
    first change (before the worker was submitted) and after an ``ended`` phase is not
    counted, nor a held phase of an attempt that had ended (``in_force``). Intervals never
    cross a UTC hour; running ones never cross a UTC minute, and are productive or idle by the
    mean utilisation of their whole minute, so that counting a window in one piece or in
    several gives the same intervals' sums. Winding down is bounded (``winding_down``)."""
    ordered = winding_down(in_force(changes))
    out: list[Interval] = []
    for current, following in zip(ordered, [*ordered[1:], None], strict=True):
        a = max(current.at, start)
        b = min(following.at if following is not None else end, end)
        if a >= b or current.gpus <= 0:
            continue
        step = MINUTE if current.phase == Phase.RUNNING else HOUR
        for piece_start, piece_end in _cut(a, b, step):
            busy = None
            if current.phase == Phase.RUNNING:
                minute = piece_start.replace(second=0, microsecond=0)
                busy = utilization(minute, minute + MINUTE)
            counted = classify(current.phase, busy)
            if counted is None:
                continue
            category, held = counted
            piece = Interval(
                piece_start,
                piece_end,
                category,
                held,
                current.gpus,
                current.machine_id if held else None,
            )
            if out and _continues(out[-1], piece):
                out[-1] = Interval(
                    out[-1].start, piece.end, category, held, piece.gpus, piece.machine_id
                )
            else:
                out.append(piece)
    return out


def _continues(last: Interval, piece: Interval) -> bool:
    """The piece extends the last interval: same kind, adjacent, in the same UTC hour."""
    return (
        last.end == piece.start
        and (last.category, last.held, last.gpus, last.machine_id)
        == (piece.category, piece.held, piece.gpus, piece.machine_id)
        and _hour(last.start) == _hour(piece.start)
    )


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Ledger:
    """GPU time by category, held and not held, in seconds; the seed's ledger object from it."""

    held: dict[Category, float]
    not_held: dict[Category, float]

    @classmethod
    def of(cls, items: Iterable[Interval]) -> Ledger:
        ledger = cls.empty()
        for i in items:
            (ledger.held if i.held else ledger.not_held)[i.category] += i.gpu_seconds
        return ledger

    @classmethod
    def empty(cls) -> Ledger:
        return cls(dict.fromkeys(CATEGORIES, 0.0), dict.fromkeys(CATEGORIES, 0.0))

    @classmethod
    def of_columns(cls, held: Sequence[float], not_held: Sequence[float]) -> Ledger:
        """From GPU-seconds in the order of CATEGORIES (none at all: an empty ledger)."""
        if not held:
            return cls.empty()
        return cls(
            dict(zip(CATEGORIES, held, strict=True)), dict(zip(CATEGORIES, not_held, strict=True))
        )

    @classmethod
    def of_sums(cls, parts: Iterable[tuple[str, bool, float]]) -> Ledger:
        """From GPU-seconds by category (its value) and held."""
        ledger = cls.empty()
        for category, is_held, seconds in parts:
            (ledger.held if is_held else ledger.not_held)[CATEGORY_BY_VALUE[category]] += seconds
        return ledger

    @property
    def allocated(self) -> float:
        return sum(self.held.values())

    @property
    def waiting(self) -> float:
        return sum(self.not_held.values())

    @property
    def productive(self) -> float:
        return self.held[Category.PRODUCTIVE]

    @property
    def asked(self) -> float:
        return self.allocated + self.waiting

    @property
    def lost(self) -> float:
        return self.asked - self.productive

    @property
    def goodput(self) -> float | None:
        """Productive over held; None (absent) when nothing was held."""
        return self.productive / self.allocated if self.allocated > 0 else None

    def to_json(self) -> dict[str, object]:
        """The seed's ledger: ``gpu_hours`` by category (held and not), ``held_gpu_hours``,
        ``allocated_gpu_hours``, ``productive_gpu_hours``, ``lost_gpu_hours``,
        ``waiting_gpu_hours`` and ``goodput`` (absent when nothing was held)."""
        hours = 3600.0
        out: dict[str, object] = {
            "gpu_hours": {c.value: (self.held[c] + self.not_held[c]) / hours for c in Category},
            "held_gpu_hours": {c.value: self.held[c] / hours for c in Category},
            "allocated_gpu_hours": self.allocated / hours,
            "productive_gpu_hours": self.productive / hours,
            "lost_gpu_hours": self.lost / hours,
            "waiting_gpu_hours": self.waiting / hours,
        }
        if self.goodput is not None:
            out["goodput"] = self.goodput
        return out


def ledgers_by_id(sums: Iterable[tuple[int, str, bool, float]]) -> dict[int, Ledger]:
    """Ledgers by scope id, from the (scope id, category, held, seconds) sums the ledgers'
    queries answer."""
    parts: dict[int, list[tuple[str, bool, float]]] = defaultdict(list)
    for scope_id, category, held, seconds in sums:
        parts[scope_id].append((category, held, seconds))
    return {i: Ledger.of_sums(p) for i, p in parts.items()}


# -- reading the ledgers -------------------------------------------------------------------------

SCOPES = ("workspace", "run", "machine", "pool")
MAX_PERIOD = timedelta(days=400)
DEFAULT_PERIOD = timedelta(days=7)
MAX_WEEKS = 57  # a period is at most 400 days


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def week_start(moment: datetime) -> datetime:
    """The Monday 00:00 UTC that begins the ISO week of ``moment``."""
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


def iso_week(moment: datetime) -> str:
    year, week, _ = moment.isocalendar()
    return f"{year}-W{week:02d}"


@dataclass(frozen=True)
class Period:
    """Whole UTC hours [start, end): the ledgers' unit."""

    start: datetime
    end: datetime


def parse_period(
    start: str | None, end: str | None, now: datetime
) -> tuple[Period | None, list[tuple[str, str]]]:
    """``start`` and ``end`` (RFC 3339 or Unix time; by default the last 7 days to now) as
    whole hours; the problems, by field, when they are not a period of at most 400 days."""
    problems: list[tuple[str, str]] = []
    moments: dict[str, datetime] = {}
    for field, raw in (("start", start), ("end", end)):
        if raw is None or raw == "":
            continue
        try:
            moments[field] = datetime.fromtimestamp(parse_time(raw) / 1000, tz=now.tzinfo)
        except BadTime as error:
            problems.append((field, str(error)))
    if problems:
        return None, problems
    until = moments.get("end", now)
    since = moments.get("start", until - DEFAULT_PERIOD)
    period = Period(
        hour_floor(since),
        hour_floor(until) + HOUR if until > hour_floor(until) else hour_floor(until),
    )
    if period.end <= period.start:
        return None, [("end", "must be after start")]
    # The span asked for, not its whole hours: `start` 400 days ago and `end` now by default
    # is 400 days, though its last hour ends later (issue 21, seed G-32).
    if hour_floor(until) - hour_floor(since) > MAX_PERIOD:
        return None, [("start", "a period is at most 400 days")]
    return period, []


def ettr(productive: float, gpus: int, submitted: datetime, until: datetime) -> float | None:
    """The effective training time ratio (issue 23): productive GPU-seconds over what the
    run's whole gang could have had from its submission to ``until`` (its end, or how far the
    tick has counted while it goes): its GPUs times that wall time. Waiting, starting, restarts
    and every loss count against it; a run its owner stopped is not charged past its end.
    None before any time passed."""
    possible = (until - submitted).total_seconds() * gpus
    return productive / possible if possible > 0 else None


# A series' steps (goodput over time, issue 23): a point an hour, or a point a UTC day.
DAY = timedelta(days=1)
STEPS = {"hour": HOUR, "day": DAY}


def day_floor(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def series_points(period: Period, step: str) -> list[Period]:
    """The points of a series over the period: its hours, or its UTC days, the first and the
    last cut to the period (a period from 06:00 begins with that day's last 18 hours). They
    cover the period once, in order."""
    floor = hour_floor if step == "hour" else day_floor
    out = []
    moment = period.start
    while moment < period.end:
        following = min(floor(moment) + STEPS[step], period.end)
        out.append(Period(moment, following))
        moment = following
    return out


# -- rework (issue 23) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RedoSpan:
    """A restart's span of work done again: from its new attempt's placement until a worker
    reached the run's highest step again, or the run restarted once more (None: still open).
    ``reached_step`` and ``checkpoint_step`` None: not reported, its rework is unknown."""

    restarted_at: datetime
    until: datetime | None
    reached_step: int | None
    checkpoint_step: int | None

    @property
    def known(self) -> bool:
        return self.reached_step is not None and self.checkpoint_step is not None

    @property
    def steps_redone(self) -> int | None:
        """The steps from the checkpoint it went back to up to the one it had reached."""
        if self.reached_step is None or self.checkpoint_step is None:
            return None
        return max(self.reached_step - self.checkpoint_step, 0)


def redone_seconds(
    start: datetime, end: datetime, gpus: int, redo: RedoSpan, period: Period
) -> float:
    """The GPU-seconds of a productive interval [start, end) of ``gpus`` GPUs that fall in the
    redo's span and the period: rework. Never more than the interval's own, so rework never
    exceeds productive time."""
    first = max(start, redo.restarted_at, period.start)
    last = min(end, period.end) if redo.until is None else min(end, redo.until, period.end)
    return max((last - first).total_seconds(), 0.0) * gpus
