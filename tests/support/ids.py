"""The ids the API shows (backend/ids.py: opaque, each the database's number under the
install's key), opened in the tests to compare with the rows they wrote."""

from __future__ import annotations

from backend import ids
from backend.db import Database
from backend.ids import Kind


def opened(kind: Kind, shown: str) -> int:
    """The number behind an id the API showed, by the key of whichever database of this test
    process showed it (another key opens it as no id: its check bytes would not hold)."""
    for codec in list(ids._CODECS.values()):
        number = codec.open(kind, shown)
        if number is not None:
            return number
    raise AssertionError(f"{shown!r} is no {kind.name.lower()} id any database here showed")


async def shown(db: Database, kind: Kind, number: int) -> str:
    """The id the API shows for the row ``number`` of ``db``."""
    return (await ids.codec(db)).show(kind, number)
