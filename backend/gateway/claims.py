"""Which replica holds which machine's stream, recorded in Redis: ``<prefix>:machine:<machine
id>`` names the replica. A claim is set when the stream opens (the newest stream wins),
refreshed while it lives, deleted when it closes; it expires after its TTL, so the claims of
a replica that died go too."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

CLAIM_TTL = 30.0  # seconds a claim on a machine lives unless its replica refreshes it

# A claim is refreshed only while it is this replica's or nobody's: a newer stream of the
# machine, opened on another replica, is not taken back by an old one not yet closed.
_REFRESH = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Claims:
    """One replica's claims on the machines whose stream it holds."""

    def __init__(self, redis: Redis, prefix: str, replica_id: str, ttl: float) -> None:
        self.redis = redis
        self.prefix = prefix
        self.replica_id = replica_id
        self.ttl = ttl
        self.stopping = False
        # Held now; opened since the last write (set outright); let go (deleted).
        self.held: set[int] = set()
        self.opened: set[int] = set()
        self.released: set[int] = set()
        self.changed = asyncio.Event()

    def key(self, machine_id: int) -> str:
        return f"{self.prefix}:machine:{machine_id}"

    def stream_changed(self, machine_id: int, held: bool) -> None:
        if held:
            self.held.add(machine_id)
            self.opened.add(machine_id)
            self.released.discard(machine_id)
        else:
            self.held.discard(machine_id)
            self.opened.discard(machine_id)
            self.released.add(machine_id)
        self.changed.set()

    def stop(self) -> None:
        """The replica stops serving: ``keep`` ends."""
        self.stopping = True
        self.changed.set()

    async def keep(self) -> None:
        """Write claims as streams open and close, and refresh them well within their TTL."""
        while not self.stopping:
            self.changed.clear()
            try:
                await self._write()
                wait = self.ttl / 3
            except (RedisError, OSError) as error:
                log.warning("could not record this replica's machines in Redis: %s", error)
                wait = min(1.0, self.ttl / 3)
            # not wait_for: see _wait in backend/gateway/redis_router.py
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.changed.wait()

    async def _write(self) -> None:
        opened, self.opened = self.opened, set()
        released, self.released = self.released, set()
        ttl_ms = int(self.ttl * 1000)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for machine_id in released:
                    pipe.eval(_RELEASE, 1, self.key(machine_id), self.replica_id)
                for machine_id in opened:
                    pipe.set(self.key(machine_id), self.replica_id, px=ttl_ms)
                for machine_id in self.held - opened:
                    pipe.eval(_REFRESH, 1, self.key(machine_id), self.replica_id, ttl_ms)
                await pipe.execute()
        except BaseException:
            self.opened |= opened & self.held  # written next time, unless changed meanwhile
            self.released |= released - self.held
            raise

    async def release_all(self) -> None:
        machines = self.held | self.released
        self.held.clear()
        self.opened.clear()
        self.released.clear()
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for machine_id in machines:
                    pipe.eval(_RELEASE, 1, self.key(machine_id), self.replica_id)
                await pipe.execute()
        except (RedisError, OSError) as error:
            log.warning("could not release this replica's machines (they expire): %s", error)
