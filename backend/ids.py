"""Ids as the API shows them (issue 37 N8): opaque, so that they count nothing.

The database numbers runs, workers, events and webhooks in one sequence each, for every
workspace together: shown as they are, the difference between two of a workspace's own ids is
how many other workspaces made in between (a run id that grew by 40 in an hour says another
team submitted 39). Each is shown as one AES block of its kind and number under the install's
key (``install_keys``, shared by every process of the install through its database), written
in 22 characters of base64url: the same id every time, and nothing of the number behind it.
An id the API is given back (a page's ``before``, a subscription's ``after``, a webhook to
delete) is opened with the key; one that does not open as that kind is no id of ours.

The order of events stays the server's: a reader asks for the next page with the id it was
given, never by comparing two.
"""

from __future__ import annotations

import base64
import binascii
import os
import weakref
from enum import IntEnum

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession

from backend.db import Database
from backend.models import InstallKey

KEY_NAME = "ids"
SHOWN_LENGTH = 22  # 16 bytes in base64url, unpadded
_PAD = bytes(7)


class Kind(IntEnum):
    """What an id names: a run's id never opens as a worker's."""

    RUN = 1
    WORKER = 2
    EVENT = 3
    WEBHOOK = 4
    TOKEN = 5


class IdCodec:
    """Shows numbers as opaque ids, and opens them again, with one install's key."""

    def __init__(self, key: bytes) -> None:
        self._cipher = Cipher(algorithms.AES(key), modes.ECB())

    def __repr__(self) -> str:
        return "IdCodec()"  # never the key

    def show(self, kind: Kind, number: int) -> str:
        block = bytes([kind]) + _PAD + number.to_bytes(8, "big")
        encryptor = self._cipher.encryptor()
        sealed = encryptor.update(block) + encryptor.finalize()
        return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()

    def open(self, kind: Kind, shown: str) -> int | None:
        """The number behind ``shown``, or None: not an id of this kind of this install.
        (0 is no row's: a cursor before the first, which only the install can show.)"""
        if len(shown) != SHOWN_LENGTH or not shown.isascii():
            return None
        try:
            sealed = base64.urlsafe_b64decode(shown + "==")
        except (binascii.Error, ValueError):
            return None
        if len(sealed) != 16:
            return None
        decryptor = self._cipher.decryptor()
        block = decryptor.update(sealed) + decryptor.finalize()
        number = int.from_bytes(block[8:], "big")
        if block[0] != kind or block[1:8] != _PAD or number >= 2**63:
            return None
        return number


_CODECS: weakref.WeakKeyDictionary[Engine, IdCodec] = weakref.WeakKeyDictionary()


async def codec(db: Database) -> IdCodec:
    """The install's codec: its key read once per engine (made if the database has none)."""
    engine = db.engine.sync_engine
    found = _CODECS.get(engine)
    if found is None:
        async with db.read() as session:
            key = await _key(session)
        if key is None:
            async with db.transaction() as session:
                await _make_key(session)
                key = await _key(session)
        assert key is not None
        found = _CODECS.setdefault(engine, IdCodec(key))
    return found


async def session_codec(session: AsyncSession) -> IdCodec:
    """The codec, inside a transaction already open (a job's): its key read, or made, there."""
    bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    found = _CODECS.get(engine)
    if found is None:
        key = await _key(session)
        if key is None:
            await _make_key(session)
            key = await _key(session)
        assert key is not None
        found = _CODECS.setdefault(engine, IdCodec(key))
    return found


async def _key(session: AsyncSession) -> bytes | None:
    return await session.scalar(select(InstallKey.value).where(InstallKey.name == KEY_NAME))


async def _make_key(session: AsyncSession) -> None:
    """The key, unless another process made it first (that one is kept)."""
    values = {"name": KEY_NAME, "value": os.urandom(16)}
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(pg_insert(InstallKey).values(values).on_conflict_do_nothing())
    else:
        await session.execute(sqlite_insert(InstallKey).values(values).on_conflict_do_nothing())
