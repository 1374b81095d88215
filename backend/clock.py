"""Time, asked for through one interface so every time rule can run under a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


def iso_z(moment: datetime) -> str:
    """``2026-10-01T01:02:11.402117Z``: the seed's history timestamps, always microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def iso_offset(moment: datetime) -> str:
    """``2026-10-01T03:12:44.118202+00:00``: the seed's ``last_failure.failed_at``."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")
