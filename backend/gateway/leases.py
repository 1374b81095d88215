"""Each replica renews the leases of the machines it hears from: in memory per message, in the
database once an interval for all of them.

A machine's heartbeat (any of its messages) only notes that it was heard, and when; it takes
no write of its own and never waits behind the stream's other messages. Every few seconds the
keeper renews the leases of the machines heard since the last renewal in one statement, on a
connection of its own (the request pool may be taken by reads), and records when each was last
heard (its last contact: a machine found lost later is lost from then, issue 36). A machine
whose messages wait to be written because the server is behind (its stream's queue is full, so
it is read no faster than it is written) counts as heard now: that it is not read is the
server's doing, not the agent's silence.

The same few seconds write the last lines the replica relayed of each worker, where new ones
came (backend/gateway/seen_lines.py), in a transaction after the renewal's.

Across replicas: each renews only the machines whose stream it holds. A replica that dies
renews nothing more, and its machines are lost one lease after they were last renewed unless
their agents reconnect elsewhere (a Hello renews the lease). A machine whose renewal finds it
lost already has its stream ended, so its agent says Hello again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from backend.clock import Clock
from backend.db import Database
from backend.db.retries import database_away
from backend.gateway import service
from backend.gateway.seen_lines import Seen, SeenLines

log = logging.getLogger(__name__)

# How often, at most, leases are renewed; a lease sixth when that is shorter.
RENEW_EVERY_S = 5.0
# A renewal that takes longer is logged (a warning): leases are at risk long before it is a
# lease long.
SLOW_RENEWAL_S = 2.0


def renew_interval(lease: timedelta) -> float:
    """Seconds between renewals: often enough that a lease outlasts several of them."""
    return min(RENEW_EVERY_S, lease.total_seconds() / 6)


class LeaseKeeper:
    """The leases of one replica's machines.

    ``backlogged`` names the machines whose messages wait unread because the server is
    behind; ``lost`` is told of machines whose renewal found them lost (their streams end);
    ``seen`` holds the workers' last lines relayed, written with each renewal.
    """

    def __init__(
        self,
        db: Database,
        clock: Clock,
        lease: timedelta,
        *,
        interval: float,
        backlogged: Callable[[], Iterable[int]],
        lost: Callable[[set[int]], None],
        seen: SeenLines | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.lease = lease
        self.interval = interval
        self.backlogged = backlogged
        self.lost = lost
        self.seen = seen or SeenLines()
        # The machines heard since the last renewal, each with when it was last heard.
        self.heard: dict[int, datetime] = {}
        self._own: Database | None = None
        self._task: asyncio.Task[None] | None = None
        self._last: asyncio.Task[None] | None = None
        # How many renewals were written, and the longest one took (logged when slow).
        self.renewals = 0
        self.slowest_s = 0.0

    def note(self, machine_id: int) -> None:
        """The machine was heard from now (any message of its)."""
        self.heard[machine_id] = self.clock.now()

    def start(self) -> None:
        """Renew every interval from now on (while this replica holds streams)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._renewing())

    @property
    def idle(self) -> bool:
        """Not renewing, and its own connection let go (after the last stream's stop)."""
        return (
            self._task is None and self._own is None and (self._last is None or self._last.done())
        )

    async def stop(self) -> None:
        """Stop renewing (the replica holds no stream any more) once what was heard since the
        last renewal is renewed (an agent gone a moment ago keeps its whole lease to come
        back in), and let the connection go."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # One last step, finished even when the stream that stops it is cancelled (a server
        # stopping): the connection is let go whether or not its caller waits to see it.
        self._last = asyncio.create_task(self._last_renewal())
        await asyncio.shield(self._last)

    async def _last_renewal(self) -> None:
        try:
            await self.renew()
        except Exception:
            log.exception("leases could not be renewed")
        if self._task is None:  # no stream came meanwhile
            own, self._own = self._own, None
            if own is not None:
                await own.dispose()

    async def renew(self) -> None:
        """Renew, in one statement, the leases of the machines heard since the last renewal;
        then write the workers' last lines seen since."""
        lines = self.seen.take()
        try:
            await self._renew()
        except BaseException:
            self.seen.untaken(lines)
            raise
        if lines:
            await self._keep(lines)

    async def _renew(self) -> None:
        backlogged = set(self.backlogged())
        if backlogged:
            log.warning(
                "the server is busy: %d machines' messages wait to be written, their streams "
                "are read more slowly (their leases are renewed meanwhile)",
                len(backlogged),
            )
        # A machine whose messages wait unread is heard from now (they are there, unread).
        now = self.clock.now()
        heard, self.heard = {**self.heard, **dict.fromkeys(backlogged, now)}, {}
        if not heard:
            return
        began = time.monotonic()
        try:
            async with self._database().transaction() as session:
                renewal = await service.renew_leases(session, self.clock, heard, self.lease)
        except BaseException as error:  # a cancellation too: what was heard is not forgotten
            self.heard = {**heard, **self.heard}  # tried again at the next renewal
            if not isinstance(error, Exception) or not database_away(error):
                raise
            log.warning("the database is away: %d machines' leases wait to be renewed", len(heard))
            return
        took = time.monotonic() - began
        self.renewals += 1
        self.slowest_s = max(self.slowest_s, took)
        if took > SLOW_RENEWAL_S:  # what waits behind it: its connection, locks, a busy loop
            log.warning("the leases of %d machines took %.1fs to renew", len(heard), took)
        if renewal.held:  # written by another transaction just now: renewed next time
            self.heard = {**{m: heard[m] for m in renewal.held}, **self.heard}
            log.info(
                "%d machines' leases wait for their rows: renewed next time", len(renewal.held)
            )
        if renewal.lost:
            self.lost(renewal.lost)

    async def _keep(self, lines: list[Seen]) -> None:
        """Write the workers' last lines seen: kept for another try while the database is
        away; dropped, and said, on any other error (a worker deleted meanwhile): they are a
        snapshot's lines in case, not a record."""
        try:
            async with self._database().transaction() as session:
                await service.keep_seen_lines(session, lines)
        except BaseException as error:
            if isinstance(error, Exception) and database_away(error):
                self.seen.untaken(lines)
                return
            if not isinstance(error, Exception):
                self.seen.untaken(lines)
                raise
            log.warning("the last lines seen of %d workers were not kept: %s", len(lines), error)

    async def _renewing(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.renew()
            except Exception:
                log.exception("leases could not be renewed; they are tried again")

    def _database(self) -> Database:
        """A connection of the keeper's own, not one of the requests' pool."""
        if self._own is None:
            url = self.db.engine.url.render_as_string(hide_password=False)
            self._own = Database.from_url(url, pool_size=1)
        return self._own
