"""One watcher of the followed logs for the whole agent: a follow is woken the moment its
worker's log is written (inotify, through watchfiles), not when a timer next looks (issue 24:
a look every 0.2 s made a followed line 102 ms late at the median, 197 ms at p95).

The log is written by another process (the worker's shim, agent/shim.py), so only the kernel
can say when. One watcher serves every follow: it watches the folders of the workers being
followed (and the logs' root while one of them is not there yet: a worker's folder appears
when its process starts), is started by the first follow, stopped by the last, and started
anew when the folders to watch change. A follow still looks on its own now and then
(agent/log_replies.py FOLLOW_FALLBACK_S), so that its lines come where no event does: a
filesystem without inotify, a watcher that could not start (said once in the agent's log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from watchfiles import awatch

log = logging.getLogger("astraeus.agent")
# watchfiles says every batch of changes at INFO: a line in the agent's log per write followed.
logging.getLogger("watchfiles").setLevel(logging.WARNING)

# watchfiles hands over a batch once a step passes with nothing new: a write reaches its follow
# 1 to 2 steps later. Measured here (2 cores): 5 ms steps, 6-10 ms after the write, for 0.4 % of
# a core while any follow is on (2 ms: 3-4 ms for 0.9 %; 10 ms: 20 ms for 0.2 %).
WATCH_STEP_MS = 5
# The longest a batch is held while new files keep changing (many followed workers at once).
WATCH_DEBOUNCE_MS = 20


class LogWatch:
    """The folders of followed logs, watched together; each follow holds an event that a write
    in its worker's folder sets (``following``)."""

    def __init__(self, root: Path) -> None:
        self.root = root  # the logs' root: a folder of each worker's log in it
        self.follows: dict[str, set[asyncio.Event]] = {}  # by the worker's log folder
        self.watched: frozenset[str] = frozenset()
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None
        self.ending: set[asyncio.Task[None]] = set()  # watchers told to stop, a step from it
        self.failed = False  # a watcher failed: said once

    @contextlib.contextmanager
    def following(self, folder: Path) -> Iterator[asyncio.Event]:
        """An event set when something in ``folder`` is written, while the block lasts."""
        key = str(folder)
        written = asyncio.Event()
        self.follows.setdefault(key, set()).add(written)
        self._rewatch()
        try:
            yield written
        finally:
            waiting = self.follows[key]
            waiting.discard(written)
            if not waiting:
                del self.follows[key]
            self._rewatch()

    def _rewatch(self) -> None:
        """Watch the followed folders there are now (none followed: no watcher)."""
        wanted = frozenset(f for f in self.follows if os.path.isdir(f))
        if len(wanted) < len(self.follows) and self.root.is_dir():
            wanted |= {str(self.root)}  # where a followed folder not there yet will appear
        if wanted == self.watched and self.task is not None and not self.task.done():
            return
        if self.stop is not None and self.task is not None:
            self.stop.set()  # it ends at its next step (a batch it still hands: a read more)
            self.ending.add(self.task)
            self.task.add_done_callback(self.ending.discard)
        self.watched, self.stop, self.task = wanted, None, None
        if wanted:
            self.stop = asyncio.Event()
            self.task = asyncio.get_running_loop().create_task(
                self._watch(wanted, self.stop), name="log-watch"
            )

    async def _watch(self, folders: frozenset[str], stop: asyncio.Event) -> None:
        # awatch sets its inotify watches before its first await; each follow, woken once
        # they are set, reads what was written while none watched (before, or in a restart).
        asyncio.get_running_loop().call_soon(self._wake_all)
        try:
            async for changes in awatch(
                *sorted(folders),
                watch_filter=None,
                step=WATCH_STEP_MS,
                debounce=WATCH_DEBOUNCE_MS,
                stop_event=stop,
                recursive=False,
            ):
                self._woken({path for _, path in changes})
        except Exception as error:  # the follows go on, looking every FOLLOW_FALLBACK_S
            if not self.failed:
                log.warning(
                    "followed logs are not pushed as written, only looked at now and then: "
                    "inotify could not watch their folders (%s: %s)",
                    type(error).__name__,
                    error,
                )
            self.failed = True

    def _woken(self, paths: set[str]) -> None:
        appeared = False
        for path in paths:
            for written in self.follows.get(os.path.dirname(path), ()):
                written.set()
            if path in self.follows and path not in self.watched:
                appeared = True  # a followed worker's folder, made as its process starts
                for written in self.follows[path]:
                    written.set()
        if appeared:
            self._rewatch()

    def _wake_all(self) -> None:
        for waiting in self.follows.values():
            for written in waiting:
                written.set()
