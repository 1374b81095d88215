"""The cells a report reads for a period: whole days from the daily ledger, a day covered in
part either by its hours or as the whole day less its hours outside (seed G-18)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.accounting.ledger_queries import spans

HOUR = timedelta(hours=1)
BASE = datetime(2026, 10, 5, tzinfo=UTC)


def hours_of(start: datetime, end: datetime) -> Counter[datetime]:
    out: Counter[datetime] = Counter()
    moment = start
    while moment < end:
        out[moment] += 1
        moment += HOUR
    return out


@settings(max_examples=500)
@given(st.integers(0, 24 * 30), st.integers(1, 24 * 30))
def test_the_signed_spans_add_up_to_every_hour_of_the_period_once(first: int, length: int) -> None:
    start, end = BASE + first * HOUR, BASE + (first + length) * HOUR
    total: Counter[datetime] = Counter()
    cells = 0
    for unit, since, until, sign in spans(start, end):
        assert since < until
        if unit == "day":
            assert since.hour == 0 and until.hour == 0
        for hour, n in hours_of(since, until).items():
            total[hour] += sign * n
        cells += (until - since) // (timedelta(days=1) if unit == "day" else HOUR)
    assert +total == hours_of(start, end) and -total == Counter()
    assert cells <= length  # never more cells than the hours themselves
    assert cells <= length // 24 + 2 * 13  # whole days, and at most 13 cells at either end


def test_the_benchmarks_week_reads_seventeen_cells_not_168() -> None:
    start = BASE + 5 * HOUR
    got = spans(start, start + timedelta(days=7))
    assert got == [
        ("day", BASE, BASE + timedelta(days=1), 1),
        ("hour", BASE, start, -1),
        ("day", BASE + timedelta(days=1), BASE + timedelta(days=7), 1),
        ("hour", BASE + timedelta(days=7), start + timedelta(days=7), 1),
    ]
