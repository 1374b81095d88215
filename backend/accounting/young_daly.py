"""How often to checkpoint, pure (issue 41): the Young-Daly interval and what a run loses to
checkpoints and failures at an interval.

A run that checkpoints every ``T`` seconds, each checkpoint costing ``C`` seconds, and is
interrupted on average every ``M`` seconds (its mean time between failures) loses, to first
order, ``C / T`` of its time writing checkpoints and ``T / (2 M)`` redoing the work since the
last one after each failure (half an interval on average). The sum is least at
``T* = √(2 C M)`` (Young 1974; Daly 2006 adds terms that matter only where ``C`` nears ``M``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOURS_A_WEEK = 7 * 24


def optimal_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's interval, √(2 C M), in seconds."""
    return math.sqrt(2 * cost_s * mtbf_s)


def lost_fraction(interval_s: float, cost_s: float, mtbf_s: float) -> float:
    """The share of a run's time lost at that interval: C/T writing checkpoints, T/(2M) redoing
    work after failures."""
    return cost_s / interval_s + interval_s / (2 * mtbf_s)


@dataclass(frozen=True)
class Advice:
    optimal_interval_s: float
    lost_now: float  # shares of its time, at its interval now and at Young's
    lost_optimal: float
    gpu_hours_saved_per_week: float


def advise(interval_s: float, cost_s: float, mtbf_s: float, gpus: int) -> Advice:
    """Young's interval for a run of ``gpus`` GPUs, and the GPU-hours a week of running it would
    save against checkpointing every ``interval_s`` (never less than none)."""
    best = optimal_interval(cost_s, mtbf_s)
    now, least = lost_fraction(interval_s, cost_s, mtbf_s), lost_fraction(best, cost_s, mtbf_s)
    return Advice(best, now, least, max(now - least, 0.0) * gpus * HOURS_A_WEEK)
