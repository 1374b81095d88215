"""One look at the events table a second per process, for every event subscriber in it.

Events are rows, written by whichever replica or worker process: reading them is what works
across processes. Instead of each subscriber reading its workspace's events every second, a
process's subscribers share one bell: while any of them waits, it reads once a second how many
events became visible lately and the newest id, and rings when either changed. A subscriber
then reads its own events (and at the latest every ``IDLE_SECONDS`` in any case).

"Lately" is since the newest id seen ``SETTLE`` ago: an event's id is taken when it is
written, and its transaction may commit after one that took a larger id, so a change in the
newest id alone would miss it (the same rule as events.rules.advance). Until the bell has
looked for SETTLE, every look rings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator
from datetime import timedelta

from sqlalchemy import func, select

from backend.db import Database
from backend.events.rules import SETTLE
from backend.models import Event

log = logging.getLogger(__name__)

LOOK_SECONDS = 1.0  # how often the bell looks while someone waits
IDLE_SECONDS = 30.0  # the longest a subscriber waits without looking itself


class Bell:
    def __init__(
        self,
        db: Database,
        look_seconds: float = LOOK_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        settle: timedelta = SETTLE,
    ) -> None:
        self.db = db
        self.look_seconds = look_seconds
        self.idle_seconds = idle_seconds
        self.settle_seconds = settle / timedelta(seconds=1)
        self.waiting = 0
        self.looks = 0  # reads of the events so far (the tests count them)
        self._rung = asyncio.Event()
        self._rings = 0
        self._task: asyncio.Task[None] | None = None
        self._seen: tuple[int, int] | None = None
        # the newest id at each look within SETTLE: the oldest is where "lately" begins
        self._newest: list[tuple[float, int]] = []

    @contextlib.asynccontextmanager
    async def listening(self) -> AsyncIterator[None]:
        """While a subscriber is inside, the bell looks; it stops when none is."""
        self.waiting += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._look())
        try:
            yield
        finally:
            self.waiting -= 1

    @property
    def rings(self) -> int:
        """How often it rang: a subscriber takes this before it reads, and waits from it."""
        return self._rings

    async def wait(self, rings: int) -> None:
        """Until the bell rings after it had rung ``rings`` times (at once if it has), or
        IDLE_SECONDS. (An event that became visible between a subscriber's read and its
        wait rang in between: the wait returns at once.)"""
        if self._rings != rings:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.idle_seconds):
                await self._rung.wait()

    async def _look(self) -> None:
        loop = asyncio.get_running_loop()
        while self.waiting:
            try:
                seen: tuple[int, int] | None = await self._read(loop.time())
            except Exception as error:  # the database away: the subscribers read themselves,
                log.warning("the events bell could not read the events: %s", error)
                seen = None  # and meet the error as they would alone
            if seen is None or seen != self._seen or self._young(loop.time()):
                self._seen = seen
                self._rings += 1
                self._rung.set()
                self._rung = asyncio.Event()
            await asyncio.sleep(self.look_seconds)
        self._seen = None
        self._newest.clear()

    def _young(self, now: float) -> bool:
        """Looking for less than SETTLE: an event committed late may have an id below what
        the first look saw, and go unnoticed by the count. Until then every look rings (the
        subscribers read each second, as they would alone)."""
        return not self._newest or self._newest[0][0] > now - self.settle_seconds

    async def _read(self, now: float) -> tuple[int, int]:
        horizon = now - self.settle_seconds
        older = [entry for entry in self._newest if entry[0] < horizon]
        self._newest = older[-1:] + [entry for entry in self._newest if entry[0] >= horizon]
        since = self._newest[0][1] if self._newest else None
        async with self.db.read() as session:
            if since is None:
                count, newest = 0, await session.scalar(select(func.max(Event.id)))
            else:
                count, newest = (
                    await session.execute(
                        select(func.count(), func.max(Event.id)).where(Event.id > since)
                    )
                ).one()
        self.looks += 1
        newest = int(newest or since or 0)
        self._newest.append((now, newest))
        return int(count), newest


_BELLS: weakref.WeakKeyDictionary[Database, Bell] = weakref.WeakKeyDictionary()


def bell_of(db: Database) -> Bell:
    """The bell of this process's database."""
    bell = _BELLS.get(db)
    if bell is None:
        bell = _BELLS[db] = Bell(db)
    return bell
