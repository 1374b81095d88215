"""The agent's one watcher of followed logs (agent/log_watch.py): a write in a followed worker's
folder wakes its follows and no others; the watcher is on only while someone follows; a folder
made after its follow began is watched once it appears; a watcher that cannot start is said
once, and the follows are left to their own looks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent import log_watch
from agent.log_watch import LogWatch
from agent.logs import WorkerLog

WOKEN_WITHIN_S = 10.0  # an event comes in milliseconds; this only bounds a failing test


async def woken(written: asyncio.Event) -> bool:
    try:
        await asyncio.wait_for(written.wait(), WOKEN_WITHIN_S)
    except TimeoutError:
        return False
    return True


async def settled(watch: LogWatch) -> None:
    """The watcher started: it wakes every follow once as it does (what was written before it
    watched is read then); events from now on are writes."""
    for waiting in watch.follows.values():
        for written in waiting:
            assert await woken(written)
            written.clear()


async def test_a_write_wakes_the_follows_of_its_worker_and_no_other(tmp_path: Path) -> None:
    mine, other = WorkerLog(tmp_path, "7"), WorkerLog(tmp_path, "8")
    mine.begin()
    other.begin()
    watch = LogWatch(tmp_path)
    with (
        watch.following(mine.folder) as first,
        watch.following(mine.folder) as second,
        watch.following(other.folder) as others,
    ):
        await settled(watch)
        mine.append(b"step 1\n")
        assert await woken(first) and await woken(second)
        await asyncio.sleep(0.2)  # a batch or two later: still nothing for the other worker
        assert not others.is_set()
        first.clear()
        mine.append(b"step 2\n")  # and again: each write wakes it
        assert await woken(first)


async def test_the_watcher_is_on_only_while_someone_follows(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "7")
    log.begin()
    watch = LogWatch(tmp_path)
    assert watch.task is None
    with watch.following(log.folder):
        task = watch.task
        assert task is not None and not task.done()
        assert watch.watched == {str(log.folder)}
    assert watch.task is None and watch.watched == frozenset()
    await asyncio.wait_for(task, WOKEN_WITHIN_S)  # it ends on its own, a step later
    assert not watch.ending


async def test_a_folder_made_after_its_follow_began_is_watched_once_it_appears(
    tmp_path: Path,
) -> None:
    tmp_path.joinpath("8").mkdir()  # the logs' root exists: another worker's folder is in it
    log = WorkerLog(tmp_path, "7")  # its process has not started: no folder yet
    watch = LogWatch(tmp_path)
    with watch.following(log.folder) as written:
        assert watch.watched == {str(tmp_path)}  # the root, where it will appear
        await settled(watch)
        log.begin()
        assert await woken(written)  # its folder appeared: a watcher of it starts
        assert watch.watched == {str(log.folder)}
        written.clear()
        log.append(b"first line\n")
        # woken by this write, or by the new watcher as it starts (it reads what came before)
        assert await woken(written)
        written.clear()
        log.append(b"second line\n")
        assert await woken(written)  # a write: nothing else wakes it now


async def test_a_watcher_that_cannot_start_is_said_once_and_wakes_no_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def no_inotify(*paths: Any, **options: Any) -> AsyncIterator[set[Any]]:
        raise OSError("OS file watch limit reached")
        yield set()  # an async generator, as awatch is

    monkeypatch.setattr(log_watch, "awatch", no_inotify)
    mine, other = WorkerLog(tmp_path, "7"), WorkerLog(tmp_path, "8")
    mine.begin()
    other.begin()
    watch = LogWatch(tmp_path)
    with (
        caplog.at_level(logging.WARNING, "astraeus.agent"),
        watch.following(mine.folder) as written,
    ):
        await settled(watch)
        with watch.following(other.folder):  # a second follow tries again
            await settled(watch)
            mine.append(b"step 1\n")
            await asyncio.sleep(0.2)
            assert not written.is_set()  # its own look every FOLLOW_FALLBACK_S reads it
    said = [r.getMessage() for r in caplog.records if r.name == "astraeus.agent"]
    assert len(said) == 1, said
    assert said[0] == (
        "followed logs are not pushed as written, only looked at now and then: inotify could "
        "not watch their folders (OSError: OS file watch limit reached)"
    )
