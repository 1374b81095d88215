"""The Young-Daly interval against its formula (issue 41): √(2 C M) is where the first-order
loss C/T + T/(2M) is least, and the saving advised is that loss's difference, never negative."""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from backend.accounting import young_daly

costs = st.floats(min_value=0.5, max_value=3_600)
mtbfs = st.floats(min_value=60, max_value=10 * 365 * 86_400)
intervals = st.floats(min_value=1, max_value=30 * 86_400)


@given(cost=costs, mtbf=mtbfs, interval=intervals, gpus=st.integers(1, 4096))
@example(cost=60, mtbf=86_400, interval=3_600, gpus=8)
def test_the_interval_is_young_s_and_least_loss(
    cost: float, mtbf: float, interval: float, gpus: int
) -> None:
    told = young_daly.advise(interval, cost, mtbf, gpus)
    assert math.isclose(told.optimal_interval_s, math.sqrt(2 * cost * mtbf), rel_tol=1e-12)
    best = told.optimal_interval_s
    for other in (interval, best * 0.9, best * 1.1, best / 3, best * 3):
        assert young_daly.lost_fraction(other, cost, mtbf) >= told.lost_optimal - 1e-12
    assert math.isclose(told.lost_optimal, math.sqrt(2 * cost / mtbf), rel_tol=1e-9)
    expected = max(told.lost_now - told.lost_optimal, 0.0) * gpus * 168
    assert told.gpu_hours_saved_per_week == expected >= 0


@given(cost=costs, mtbf=mtbfs, gpus=st.integers(1, 4096))
def test_at_young_s_interval_nothing_is_saved(cost: float, mtbf: float, gpus: int) -> None:
    best = young_daly.optimal_interval(cost, mtbf)
    assert young_daly.advise(best, cost, mtbf, gpus).gpu_hours_saved_per_week <= 1e-9 * gpus


def test_a_worked_example() -> None:
    # a 1-minute checkpoint, a failure a day: every 3 220 s (53 min 40 s). Checkpointing every
    # hour instead loses 60/3600 + 3600/172800 = 1.667% + 2.083% = 3.750% of the time against
    # √(120/86400) = 3.727%: 0.0232% of 8 GPUs' 168 hours, 0.31 GPU-hours a week
    told = young_daly.advise(3_600, 60, 86_400, 8)
    assert round(told.optimal_interval_s) == 3_220
    assert told.lost_now == 0.0375
    assert round(told.lost_optimal, 6) == 0.037268
    assert round(told.gpu_hours_saved_per_week, 2) == 0.31
