"""An admin command's work in one transaction of the server's database, opened and closed
for it (the command is the boundary: it owns the transaction)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from backend.config import Settings
from backend.db import Database
from backend.errors import AstraeusError

T = TypeVar("T")


class NoDataYet(AstraeusError):
    """An embedded database asked for before `astraeus up` made it (issue 21)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(
            code="NO_DATA",
            message=(
                f"there is no Astraeus data in {settings.data_dir} yet: start it with "
                "`astraeus up` (it makes the database and the admin token), then run this again"
            ),
            status=503,
        )


def in_transaction(settings: Settings, work: Callable[..., Awaitable[T]]) -> T:
    async def one(db: Database) -> T:
        async with db.transaction() as session:
            return await work(session)

    return with_database(settings, one)


def with_database(settings: Settings, work: Callable[[Database], Awaitable[T]]) -> T:
    """The command's work with the server's database, for work that opens transactions of its
    own (a Slurm import reads Slurm between two)."""
    # SQLAlchemy's 'unable to open database file' (a traceback), said plainly: no `up` yet
    url = settings.resolved_database_url
    embedded = url.startswith("sqlite:///") and ":memory:" not in url
    if embedded and not Path(url.removeprefix("sqlite:///")).is_file():
        raise NoDataYet(settings)

    async def go() -> T:
        db = Database.from_url(settings.resolved_database_url)
        try:
            return await work(db)
        finally:
            await db.dispose()

    return asyncio.run(go())
