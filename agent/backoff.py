"""Waits that double after each failed attempt, up to a cap, jittered if asked: the one
backoff of the agent's reconnects, the server's retries (its Redis channel, a message the
database could not take) and `astraeus up`'s restarts of its local agent. The server imports
it from here as it does ``agent.transport``: the agent imports nothing of the server.

A small class rather than tenacity: these are loops that run for the process's life, whose
wait starts over after a success or after an attempt that lasted long enough, and whose cap
the server may lower (the agent's, to a quarter of its lease); tenacity's decorators retry one
call until it succeeds and keep no such state between calls.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """``first`` seconds, then twice the last wait, at most ``cap``. ``jitter`` spreads each
    wait over ``[1 - jitter, 1 + jitter]`` times it (many agents reconnecting to one server do
    not all come back together); ``reset_after``: an attempt that lasted this many seconds
    starts the waits over."""

    first: float
    cap: float
    jitter: float = 0.0
    reset_after: float | None = None
    uniform: Callable[[float, float], float] = random.uniform
    _next: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._next = self.first

    def reset(self) -> None:
        """After a success: the next wait is ``first`` again."""
        self._next = self.first

    def wait(self, lasted: float | None = None) -> float:
        """Seconds to wait before the next attempt, after one that lasted ``lasted`` seconds
        (None: not measured)."""
        if lasted is not None and self.reset_after is not None and lasted >= self.reset_after:
            self.reset()
        wait = min(self._next, self.cap)
        self._next = min(wait * 2, self.cap)
        if self.jitter:
            return wait * self.uniform(1 - self.jitter, 1 + self.jitter)
        return wait
