"""What actors run with in a worker process: one database handle, the system clock; and what a
serving process does once it has started (``freeze_what_started``)."""

from __future__ import annotations

import functools
import gc

from backend.clock import Clock, SystemClock
from backend.config import Settings, get_settings
from backend.db import Database

_db: Database | None = None
_clock: Clock = SystemClock()
_settings: Settings | None = None


def configure(settings: Settings, clock: Clock | None = None) -> None:
    """Use these settings (not the environment's) for the database the actors open, and this
    clock (tests give a fake one)."""
    global _settings, _db, _clock
    _settings, _db = settings, None
    _clock = clock or SystemClock()


def database() -> Database:
    """Created on first use, inside the actors' event loop, which its connections belong to."""
    global _db
    if _db is None:
        settings = _settings or get_settings()
        # one_writer: the job threads' transactions one at a time on SQLite (issue 19)
        _db = Database.from_url(
            settings.resolved_database_url, pool_size=settings.db_pool_size, one_writer=True
        )
    return _db


def clock() -> Clock:
    return _clock


def settings() -> Settings:
    return _settings or get_settings()


@functools.cache
def freeze_what_started() -> None:
    """Once a process: what it loaded to start (modules, the schema, the pools) lives as long
    as it does, so it leaves the garbage collector's care (gc.freeze, after a collection). A
    full collection then walks only what requests and jobs made: without this, one falls inside
    a 7-day report over 10 000 runs about every other time and adds 40-100 ms, and a first
    scheduling pass over 10 000 runs walks the modules' objects three times (issue 40)."""
    gc.collect()
    gc.freeze()
