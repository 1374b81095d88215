"""Which alerts fire, pure: the seed's goodput_drop, and threshold alerts on other figures.

"A workspace's or pool's goodput over the last complete hour under 50%, and 20 points or more
under the day before, fires the goodput_drop alert (at least one GPU-hour held in that hour).
The thresholds are the cluster's." Threshold alerts fire when a count reaches its threshold:
workers stalled (in a workspace), runs with a straggler (in a workspace), unhealthy GPUs (on
the cluster); and when a Slurm-backed cluster's import is behind by its threshold in seconds
(issue 38 F3: its jobs are not counted past its last read meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from backend.accounting.rules import Ledger
from backend.config import format_duration

DEFAULTS: dict[str, float] = {
    "goodput_drop.below": 0.50,
    "goodput_drop.points": 0.20,
    "goodput_drop.min_held_gpu_hours": 1.0,
    "workers_stalled": 1,
    "runs_with_straggler": 1,
    "gpu_faults": 1,
    "slurm_import_lag": 300,  # seconds
}
METRICS = (
    "goodput_drop",
    "workers_stalled",
    "runs_with_straggler",
    "gpu_faults",
    "slurm_import_lag",
)
WHAT = {
    "workers_stalled": "workers stalled",
    "runs_with_straggler": "runs with a straggler",
    "gpu_faults": "GPUs unhealthy",
}
ONE = {
    "workers_stalled": "worker stalled",
    "runs_with_straggler": "run with a straggler",
    "gpu_faults": "GPU unhealthy",
}


@dataclass(frozen=True)
class Finding:
    """An alert that should be firing now."""

    metric: str
    subject: str  # workspace:<name>, pool:<name>, cluster:<name>
    workspace_id: int | None
    value: float
    threshold: float
    reason: str

    @property
    def key(self) -> tuple[str, str]:
        return self.metric, self.subject


def check_threshold(name: str, value: float) -> str | None:
    """Why a threshold value is refused, or None."""
    if name not in DEFAULTS:
        return "must be one of " + ", ".join(DEFAULTS)
    if value < 0:
        return "must not be negative"
    if name in ("goodput_drop.below", "goodput_drop.points") and value > 1:
        return "is a ratio: from 0 to 1"
    return None


def goodput_drop(
    subject: str,
    workspace_id: int | None,
    hour: Ledger,
    day_before: Ledger,
    thresholds: dict[str, float],
    hour_label: str,
) -> Finding | None:
    """The seed's goodput_drop for one workspace or pool, or None."""
    held_hours = hour.allocated / 3600
    if hour.goodput is None or held_hours < thresholds["goodput_drop.min_held_gpu_hours"]:
        return None
    if day_before.goodput is None:
        return None
    drop = day_before.goodput - hour.goodput
    below = thresholds["goodput_drop.below"]
    if hour.goodput >= below or drop < thresholds["goodput_drop.points"]:
        return None
    kind, _, name = subject.partition(":")
    reason = (
        f"Goodput of {kind} {name} was {hour.goodput:.0%} in the hour from {hour_label}, "
        f"{round(drop * 100)} points under the day before ({day_before.goodput:.0%})"
    )
    return Finding("goodput_drop", subject, workspace_id, hour.goodput, below, reason)


def count_alert(
    metric: str, subject: str, workspace_id: int | None, count: int, threshold: float
) -> Finding | None:
    if threshold <= 0 or count < threshold:
        return None
    kind, _, name = subject.partition(":")
    what = ONE[metric] if count == 1 else WHAT[metric]  # "1 worker stalled" (issue 21)
    reason = f"{count} {what} in {kind} {name} (threshold {threshold:g})"
    return Finding(metric, subject, workspace_id, float(count), threshold, reason)


def import_lag(cluster: str, read_at: datetime, now: datetime, threshold: float) -> Finding | None:
    """A Slurm-backed cluster's import that last read its Slurm ``threshold`` seconds ago or
    more (at ``read_at``), or None."""
    lag = now - read_at
    if threshold <= 0 or lag.total_seconds() < threshold:
        return None
    behind = format_duration(timedelta(seconds=int(lag.total_seconds())))
    reason = (
        f"The Slurm import of cluster {cluster} is {behind} behind: it last read Slurm at "
        f"{read_at:%Y-%m-%d %H:%M:%S} UTC, and its jobs are not counted past that "
        f"(threshold {format_duration(timedelta(seconds=threshold))})"
    )
    return Finding(
        "slurm_import_lag", f"cluster:{cluster}", None, lag.total_seconds(), threshold, reason
    )
