"""What the machine's cores did while the tests ran (issue 39): whether `make test` waits or
computes decides whether more lanes (the Makefile's TEST_LANES) could shorten it. Lanes that
wait (on a stall timeout, a minute's tick, a server away) leave cores idle, which more lanes
would fill; cores busy all along leave more lanes nothing to take.

The machine's counters (/proc/stat), read every SAMPLE_S seconds in a thread of the process
that runs the session (pytest-xdist's controller), whatever else runs on the machine."""

from __future__ import annotations

import os
import resource
import threading
from dataclasses import dataclass, field
from pathlib import Path

STAT = Path("/proc/stat")
SAMPLE_S = 5.0
SATURATED = 0.9  # a sample whose cores were this busy or more: the cores were the limit


def cpu_ticks() -> tuple[int, int] | None:
    """The machine's CPU time so far, busy and in all, in clock ticks; None without /proc."""
    try:
        first = STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal
    ticks = [int(value) for value in first[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def process_cpu_seconds() -> float:
    """The CPU time (user and system) of this process and of the children it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class CpuWatch:
    """The share of the cores' time that was busy, over the whole run and sample by sample."""

    samples: list[float] = field(default_factory=list)
    start: tuple[int, int] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def begin(self) -> None:
        self.start = cpu_ticks()
        if self.start is None:
            return
        self.thread = threading.Thread(target=self._sample, name="cpu-watch", daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        last = self.start
        while not self.stop.wait(SAMPLE_S):
            now = cpu_ticks()
            if now is not None and last is not None and now[1] > last[1]:
                self.samples.append((now[0] - last[0]) / (now[1] - last[1]))
            last = now

    def summary(self) -> str | None:
        """One line: how busy the cores were over the run, and in how many samples they were
        all but saturated; None without /proc or before a sample."""
        self.stop.set()
        end = cpu_ticks()
        if self.start is None or end is None or end[1] <= self.start[1] or not self.samples:
            return None
        busy = (end[0] - self.start[0]) / (end[1] - self.start[1])
        saturated = sum(1 for s in self.samples if s >= SATURATED) / len(self.samples)
        load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        return (
            f"cpu: {os.cpu_count()} cores {busy:.0%} busy over the run; {saturated:.0%} of its "
            f"{SAMPLE_S:g} s samples {SATURATED:.0%} busy or more; load average now {load}\n"
            f"cpu by minute (% busy): {' '.join(str(m) for m in self.by_minute())}"
        )

    def by_minute(self) -> list[int]:
        """How busy the cores were in each minute of the run, in percent: where they idled
        (the first lanes' start, the last modules' tail) is where the run can still shrink."""
        per = max(1, round(60 / SAMPLE_S))
        return [
            round(100 * sum(chunk) / len(chunk))
            for chunk in (self.samples[i : i + per] for i in range(0, len(self.samples), per))
        ]
