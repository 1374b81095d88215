"""An idle policy's verdict, pure: which whole minutes a check looks at, and whether every GPU
of a run was measured under the policy's utilization in each of them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from backend.config import parse_duration

MINUTE = timedelta(minutes=1)
MINUTE_MS = 60_000


@dataclass(frozen=True)
class Policy:
    """A run's idle policy as stored (spec.IdlePolicy's JSON): ``below`` a ratio (0 to 1)."""

    below: float
    window: timedelta
    action: str

    @classmethod
    def stored(cls, data: Mapping[str, Any]) -> Policy:
        below = float(data.get("gpu_utilization_below", 5.0)) / 100
        return cls(below, parse_duration(str(data["for"])), str(data.get("action", "stop")))


def window_of(now: datetime, window: timedelta) -> tuple[datetime, datetime]:
    """The whole minutes a check at ``now`` looks at: the ``window`` of minutes that ended at the
    last whole minute (the minute under way is not measured yet)."""
    end = now.replace(second=0, microsecond=0)
    return end - window, end


def idle_throughout(
    means: Mapping[tuple[int, int], Iterable[float]],
    workers: Iterable[int],
    start: datetime,
    end: datetime,
    below: float,
) -> bool:
    """Whether each worker had, in every whole minute of [start, end), its GPUs measured, and
    every GPU's mean for the minute under ``below``. ``means``: (worker, minute as epoch ms) to
    its GPUs' means. A minute without samples is not idle: a machine gone silent, or a server
    behind on writing them, is not found idle (it is not known to be)."""
    first = int(start.timestamp() * 1000)
    last = int(end.timestamp() * 1000)
    minutes = range(first - first % MINUTE_MS, last, MINUTE_MS)
    for worker in workers:
        for minute in minutes:
            measured = list(means.get((worker, minute), ()))
            # (rounded: the mean of samples of exactly 5% is 5%, not a float's hair under it)
            if not measured or round(max(measured), 9) >= below:
                return False
    return True


def given_back_hours(
    gpus: int, at: datetime, limit_at: datetime | None, now: datetime, since: datetime
) -> float:
    """GPU-hours a stop at ``at`` gave back within [since, now]: its GPUs, from the stop (or
    ``since``) to now, or to when its time limit would have stopped it. Without the policy the
    run would have held them idle until someone stopped it: this counts them until now."""
    begin = max(at, since)
    finish = min(now, limit_at) if limit_at is not None else now
    if finish <= begin:
        return 0.0
    return gpus * (finish - begin).total_seconds() / 3600
