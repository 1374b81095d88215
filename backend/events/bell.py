"""One look at the events a second per process, for every event subscriber in it; and the
horizon: the id up to which every event that will ever be visible is visible now.

Events are rows, written by whichever replica or worker process: reading them is what works
across processes. Instead of each subscriber reading its workspace's events every second, a
process's subscribers share one bell: while any of them waits, it looks once a second where
the horizon stands, and rings when it moved. A subscriber then reads its own events up to the
horizon, in id order (and waits at most ``IDLE_SECONDS`` for a ring in any case).

Why a horizon (issue 19): an event's id is taken when it is written, and on PostgreSQL its
transaction may commit after one that took a larger id. A subscriber that handed on every
visible event handed 12 before 11 (18 of 20 subscribers did under load), and a client that
resumed ``after`` 12 lost 11. Handing on only what lies below the horizon, in id order, a
subscriber hands every event once and in order, and ``after`` the last id it handed loses
nothing.

The rule, on PostgreSQL: ``nextval`` locks the events' id sequence (RowExclusiveLock) until
its transaction ends. A look reads the sequence's last value L, *then* which transactions hold
that lock: every transaction that took an id up to L took it before L was read, so it is
among them unless it already ended. Once none of them still holds the lock (a later look),
every id up to L is committed or rolled back for good: L is settled, and the horizon is the
largest settled L. It waits only for the transactions that write events and were open at the
look, however long they stay open (no guessed settle time): one left open holds every
subscriber's events back until it ends. It assumes the sequence hands its ids one at a
time (CACHE 1, PostgreSQL's default), and ids taken from it (not given).

On SQLite a write transaction holds the one write lock from its beginning to its commit
(db/engine.py): ids become visible in order, and the horizon is the largest id."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator

from sqlalchemy.ext.asyncio import AsyncSession

from backend.db import Database
from backend.events import repository

log = logging.getLogger(__name__)

LOOK_SECONDS = 1.0  # how often the bell looks while someone waits
IDLE_SECONDS = 30.0  # the longest a subscriber waits without looking itself
MOST_PENDING = 64  # looks not settled yet that the bell keeps apart


class Bell:
    def __init__(
        self,
        db: Database,
        look_seconds: float = LOOK_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self.db = db
        self.look_seconds = look_seconds
        self.idle_seconds = idle_seconds
        self.waiting = 0
        self.looks = 0  # reads of the horizon so far (the tests count them)
        self.horizon = 0  # every event up to this id that will ever be visible is visible
        self._rung = asyncio.Event()
        self._rings = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()  # the running look's: set, it ends after its read
        self._reading = asyncio.Lock()
        self._sequence: int | None = None
        # each look's last id and the transactions that held the sequence then, not settled
        self._pending: list[tuple[int, frozenset[str]]] = []

    @contextlib.asynccontextmanager
    async def listening(self) -> AsyncIterator[None]:
        """While a subscriber is inside, the bell looks; it stops when none is. The last to
        leave waits for the look's read under way, if one is: no read outlives every
        subscriber. (One that did ran on after its subscriber had gone, into a test's teardown,
        and the event loop's end cancelled it holding its connection: SQLAlchemy's warning of
        a "non-checked-in connection", reported against the next test.)"""
        self.waiting += 1
        if self._task is None or self._task.done() or self._stop.is_set():
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._look(self._stop))
        try:
            yield
        finally:
            self.waiting -= 1
            if not self.waiting:
                task, self._task = self._task, None
                self._stop.set()
                assert task is not None  # made as the first came in
                # (a subscriber arriving meanwhile starts a look of its own)
                await asyncio.wait({task})

    @property
    def rings(self) -> int:
        """How often it rang: a subscriber takes this before it reads, and waits from it."""
        return self._rings

    async def settled(self) -> int:
        """The horizon, looked at now (a subscriber's start: the bell may have been idle)."""
        await self._advance()
        return self.horizon

    async def wait(self, rings: int) -> None:
        """Until the bell rings after it had rung ``rings`` times (at once if it has), or
        IDLE_SECONDS. (The horizon moved between a subscriber's read and its wait: it rang in
        between, and the wait returns at once.)"""
        if self._rings != rings:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.idle_seconds):
                await self._rung.wait()

    async def _look(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._advance()
            except Exception as error:  # the database away: the horizon stays where it was
                log.warning("the events bell could not read the events: %s", error)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.look_seconds):
                    await stop.wait()

    async def _advance(self) -> None:
        async with self._reading:
            before = self.horizon
            async with self.db.read() as session:
                if self.db.engine.dialect.name == "postgresql":
                    horizon = await self._postgresql_horizon(session)
                else:
                    horizon = await repository.newest_id(session)
            self.looks += 1
            self.horizon = max(before, horizon)
            if self.horizon != before:
                self._rings += 1
                self._rung.set()
                self._rung = asyncio.Event()

    async def _postgresql_horizon(self, session: AsyncSession) -> int:
        if self._sequence is None:
            self._sequence = await repository.id_sequence(session)
        last = await repository.last_taken_id(session, self._sequence)  # first,
        holders = await repository.sequence_holders(session, self._sequence)  # then these
        if self._pending and self._pending[-1][1] == holders:
            self._pending[-1] = (last, holders)  # settles when the same transactions end
        else:
            self._pending.append((last, holders))
        while len(self._pending) > MOST_PENDING:  # a transaction open long, others coming
            (_, first), (ids, second) = self._pending[:2]  # and going: the two oldest settle
            self._pending[:2] = [(ids, first | second)]  # together (later, never sooner)
        settled = [ids for ids, held in self._pending if not held & holders]
        horizon = max([self.horizon, *settled])
        self._pending = [(ids, held) for ids, held in self._pending if ids > horizon]
        return horizon


_BELLS: weakref.WeakKeyDictionary[Database, Bell] = weakref.WeakKeyDictionary()


def bell_of(db: Database) -> Bell:
    """The bell of this process's database."""
    bell = _BELLS.get(db)
    if bell is None:
        bell = _BELLS[db] = Bell(db)
    return bell
