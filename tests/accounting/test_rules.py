"""Goodput accounting's pure rules: categories, conservation to the second, tick invariance."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.accounting import rules
from backend.accounting.rules import (
    Category,
    Interval,
    Ledger,
    PhaseChange,
    classify,
    in_force,
    intervals,
)
from backend.lifecycle.states import HELD_PHASES, Phase

T0 = datetime(2026, 10, 5, 9, 58, 30, tzinfo=UTC)  # a Monday, just before an hour turns


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_each_phase_is_the_seeds_category_held_or_not() -> None:
    # seed G-1 … G-10: the categories' table, row by row
    # seed G-11: preemption: stopping for it is held, waiting to be placed again is not
    # seed G-12: waiting for its first placement is not held
    expected = {
        Phase.WAITING: (Category.WAITING, False),
        Phase.STARTING: (Category.STARTING, True),
        Phase.RESTART: (Category.RESTART, True),
        Phase.STALLED: (Category.STALLED, True),
        Phase.STOPPING_OWNER: (Category.PRODUCTIVE, True),
        Phase.STOPPING_TIME_LIMIT: (Category.PRODUCTIVE, True),
        Phase.STOPPING_PREEMPTION: (Category.PREEMPTION, True),
        Phase.STOPPING_STALL: (Category.STALLED, True),
        Phase.STOPPING_FAILURE: (Category.FAILURE, True),
        Phase.REQUEUED_FAILURE: (Category.FAILURE, False),
        Phase.REQUEUED_PREEMPTION: (Category.PREEMPTION, False),
        Phase.REQUEUED_STALL: (Category.STALLED, False),
    }
    for phase, counted in expected.items():
        assert classify(phase, None) == counted, phase
    assert classify(Phase.RUNNING, 0.05) == (Category.PRODUCTIVE, True)  # 5% or more
    assert classify(Phase.RUNNING, 0.049) == (Category.IDLE, True)
    assert classify(Phase.RUNNING, None) == (Category.IDLE, True)  # nothing sampled: idle
    assert classify(Phase.ENDED, None) is None


def test_a_run_through_its_life_splits_at_transitions_minutes_and_hours() -> None:
    # seed G-13: allocated is every category but the wait for placement
    # seed G-14, G-15: goodput = productive ÷ allocated; lost = asked less productive
    changes = [
        PhaseChange(at(0), Phase.WAITING, 8),
        PhaseChange(at(20), Phase.STARTING, 8, machine_id=7),
        PhaseChange(at(50), Phase.RUNNING, 8, machine_id=7),
        PhaseChange(at(170), Phase.ENDED, 8),
    ]
    busy = {at(90): 0.9, at(150): 0.0}  # minute 10:00 busy, 10:01 idle (09:59 unsampled)

    def utilisation(start: datetime, end: datetime) -> float | None:
        return busy.get(start)

    got = intervals(changes, at(0), at(3600), utilisation)
    assert [(i.start, i.end, i.category, i.held, i.machine_id) for i in got] == [
        (at(0), at(20), Category.WAITING, False, None),
        (at(20), at(50), Category.STARTING, True, 7),
        (at(50), at(90), Category.IDLE, True, 7),  # 09:59:20 to 10:00, nothing sampled
        (at(90), at(150), Category.PRODUCTIVE, True, 7),
        (at(150), at(170), Category.IDLE, True, 7),
    ]
    ledger = Ledger.of(got).to_json()
    assert ledger["allocated_gpu_hours"] == 8 * 150 / 3600
    assert ledger["waiting_gpu_hours"] == 8 * 20 / 3600
    assert ledger["goodput"] == 60 / 150
    assert ledger["lost_gpu_hours"] == 8 * (170 - 60) / 3600


def test_a_stop_recorded_after_the_worker_ended_is_never_counted_open() -> None:
    # issue 19 (b-068-0): rank 1's exit at .376 stopped the gang before rank 0's own exit, at
    # .246, was reported: Failed at .246, then Stopping at .376 held it forever.
    failed, stopping = at(30.246), at(30.376)
    changes = [
        PhaseChange(at(0), Phase.WAITING, 8),
        PhaseChange(at(1), Phase.STARTING, 8, machine_id=7),
        PhaseChange(at(2), Phase.RUNNING, 8, machine_id=7),
        PhaseChange(failed, Phase.ENDED, 8),
        PhaseChange(stopping, Phase.STOPPING_FAILURE, 8, machine_id=7),
    ]
    assert in_force(changes) == changes[:4]
    got = intervals(changes, at(0), at(7200))
    assert got[-1].end == failed
    assert sum(i.gpu_seconds for i in got) == 8 * 30.246
    # A worker waiting to be placed again holds nothing until placed again (a new attempt).
    again = [
        PhaseChange(at(0), Phase.RUNNING, 8, machine_id=7),
        PhaseChange(at(10), Phase.REQUEUED_FAILURE, 8),
        PhaseChange(at(11), Phase.STOPPING_FAILURE, 8, machine_id=7),
        PhaseChange(at(40), Phase.RESTART, 8, machine_id=9),
        PhaseChange(at(50), Phase.RUNNING, 8, machine_id=9),
    ]
    assert in_force(again) == [again[0], again[1], again[3], again[4]]


def test_nothing_held_has_no_goodput_and_a_run_without_gpus_has_none_at_all() -> None:
    # seed G-17: only GPU time is counted: a worker without GPUs makes no interval at all
    waiting = intervals([PhaseChange(at(0), Phase.WAITING, 4)], at(0), at(600))
    assert "goodput" not in Ledger.of(waiting).to_json()
    assert intervals([PhaseChange(at(0), Phase.RUNNING, 0)], at(0), at(600)) == []


PHASES = [p.value for p in Phase]


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[PhaseChange], datetime]:
    """A worker's phase changes at any second over ~3 hours, the last maybe its end."""
    gpus = draw(st.integers(1, 8))
    seconds = sorted(draw(st.sets(st.integers(1, 3 * 3600), max_size=25)))
    phases = draw(st.lists(st.sampled_from(PHASES), min_size=len(seconds), max_size=len(seconds)))
    changes = [PhaseChange(at(0), Phase.WAITING, gpus)]
    for second, phase in zip(seconds, phases, strict=True):
        machine = 3 if phase in (Phase.STARTING, Phase.RUNNING) else None
        changes.append(PhaseChange(at(second), phase, gpus, machine))
    return changes, at(3 * 3600 + 1)


def _utilisation(start: datetime, end: datetime) -> float | None:
    """Deterministic per minute: some minutes busy, some idle, some unsampled."""
    minute = int(start.timestamp() // 60)
    return [0.9, 0.01, None][minute % 3]


def _counted_span(changes: list[PhaseChange], end: datetime) -> float:
    """GPUs times wall time from submission to its end (its first ended phase) or ``end``.

    Terminal states are terminal (issue 19): after a phase that holds nothing, a phase that
    holds GPUs but is no new placement (starting, restart) changes nothing: the time stays in
    the phase before it."""
    ordered: list[PhaseChange] = []
    for change in sorted(changes):
        holds = change.phase in HELD_PHASES
        after_end = bool(ordered) and ordered[-1].phase not in HELD_PHASES
        if holds and after_end and change.phase not in (Phase.STARTING, Phase.RESTART):
            continue
        ordered.append(change)
    seconds = 0.0
    for current, following in zip(ordered, [*ordered[1:], None], strict=True):
        stop = following.at if following is not None else end
        if current.phase != Phase.ENDED:
            seconds += (min(stop, end) - current.at).total_seconds() * current.gpus
    return seconds


@settings(max_examples=200, deadline=None)
@given(histories())
def test_conservation_every_second_counted_once(
    history: tuple[list[PhaseChange], datetime],
) -> None:
    # DESIGN §4 invariant 1: the categories add up to GPUs times wall time, to the second
    changes, end = history
    got = intervals(changes, at(0), end, _utilisation)
    assert sum(i.gpu_seconds for i in got) == _counted_span(changes, end)
    for a, b in itertools.pairwise(got):
        assert a.end <= b.start  # no second twice
    for i in got:
        assert i.start.replace(minute=0, second=0) == (i.end - timedelta(microseconds=1)).replace(
            minute=0, second=0, microsecond=0
        )  # within one UTC hour
        ledger = Ledger.of([i])
        assert ledger.asked == i.gpu_seconds


@settings(max_examples=200, deadline=None)
@given(histories(), st.lists(st.integers(0, 3 * 3600), max_size=12))
def test_counting_in_any_ticks_gives_the_same_ledger(
    history: tuple[list[PhaseChange], datetime], cuts: list[int]
) -> None:
    # DESIGN §4 invariant 1, 2: retried, late or many ticks never count a second twice
    changes, end = history
    whole = Ledger.of(intervals(changes, at(0), end, _utilisation))
    points = [at(0), *sorted({at(c) for c in cuts}), end]
    pieces: list[Interval] = []
    for a, b in itertools.pairwise(points):
        pieces += intervals(changes, a, b, _utilisation)
    split = Ledger.of(pieces)
    assert split.held == whole.held and split.not_held == whole.not_held
    assert split.allocated == sum(split.held.values())
    if split.goodput is not None:
        assert split.goodput == split.productive / split.allocated
    assert split.lost == split.asked - split.productive


def test_a_slurm_import_behind_holds_its_jobs_at_its_last_read() -> None:  # issue 38 F3
    until = datetime(2026, 12, 4, 12, 10, tzinfo=UTC)
    behind = until - rules.IMPORT_BEHIND
    assert rules.import_clip(None, until) is None  # never read: nothing of it to hold
    assert rules.import_clip(behind, until) is None  # reading as it should
    late = behind - timedelta(seconds=1)
    assert rules.import_clip(late, until) == late  # behind: held at its last read
