"""One scheduling pass at a time, however many are asked for.

Every event that may let a run start asks for a pass; a burst of them used to queue one
message each (issue 19: 423 of 430 queued messages were passes, and the goodput tick behind
them waited 6.5 minutes). A pass places every cluster's runs, so one pass queued serves every
request made before it starts. Three flags, shared by every process (Redis keys in
production, this process's memory when embedded):

- ``queued``: a pass message is in the queue. A request finding it set folds into it.
- ``running``: a pass holds it while it runs, so two never run at once.
- ``again``: a pass message arrived while another ran; the running pass goes again.

A request during a running pass finds ``queued`` cleared (a pass clears it as it starts), so
it queues one more pass: what changed after the running pass read the database is placed by
the next one. The flags expire, so a message lost with a broker restart, or a worker killed
mid-pass, stops coalescing for a while rather than for ever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from redis import Redis

# A queued pass not started within this long is taken as lost: the next request queues one.
QUEUED_TTL_S = 300
# A pass that ran this long is taken as dead (its worker killed); passes took 1-14 s in
# issue 19's load run, and Dramatiq's time limit ends an actor at 10 minutes.
RUNNING_TTL_S = 600


class Flags(Protocol):
    """Named flags with a lifetime, set by one process and seen by all."""

    def set_if_clear(self, name: str, ttl_s: int) -> bool:
        """Set ``name`` unless it is set; whether this call set it."""
        ...

    def clear(self, name: str) -> bool:
        """Clear ``name``; whether it was set."""
        ...


class RedisFlags:
    """Flags as Redis keys under the broker's namespace: every server and worker sees them."""

    def __init__(self, client: Redis, namespace: str) -> None:
        self.client, self.prefix = client, f"{namespace}:coalesce:"

    def set_if_clear(self, name: str, ttl_s: int) -> bool:
        return bool(self.client.set(self.prefix + name, b"1", nx=True, ex=ttl_s))

    def clear(self, name: str) -> bool:
        return bool(self.client.delete(self.prefix + name))


class LocalFlags:
    """Flags in this process's memory: the embedded mode's one process."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()
        self._now = now

    def set_if_clear(self, name: str, ttl_s: int) -> bool:
        with self._lock:
            now = self._now()
            if self._until.get(name, 0.0) > now:
                return False
            self._until[name] = now + ttl_s
            return True

    def clear(self, name: str) -> bool:
        with self._lock:
            return self._until.pop(name, 0.0) > self._now()


class Coalescer:
    """The flags of one kind of work (the scheduling pass) and the steps that use them."""

    def __init__(self, flags: Flags, name: str) -> None:
        self.flags = flags
        self.queued, self.running, self.again = (
            f"{name}:{f}" for f in ("queued", "running", "again")
        )

    def ask(self, enqueue: Callable[[], object]) -> bool:
        """Queue the work unless it is queued already; whether a message was sent."""
        if not self.flags.set_if_clear(self.queued, QUEUED_TTL_S):
            return False
        try:
            enqueue()
        except BaseException:
            self.flags.clear(self.queued)  # nothing is queued: the next request tries again
            raise
        return True

    async def run(self, body: Callable[[], Awaitable[None]], enqueue: Callable[[], object]) -> bool:
        """A message's turn: run ``body`` unless another process runs it now (then that one
        goes again); whether it ran here. Asks for one more run when a message arrived while
        this one ran and the flag may have been set after the last look."""
        self.flags.clear(self.queued)
        if not self.flags.set_if_clear(self.running, RUNNING_TTL_S):
            self.flags.set_if_clear(self.again, RUNNING_TTL_S)
            return False
        try:
            await body()
            while self.flags.clear(self.again):
                await body()
        finally:
            self.flags.clear(self.running)
        # A message may have found ``running`` set after the loop's last look: its request
        # is answered by one more pass, queued (not run here, so the worker is let go).
        if self.flags.clear(self.again):
            self.ask(enqueue)
        return True
