"""Secret values and webhook secrets at rest: encrypted with Fernet (AES-128-CBC + HMAC-SHA256)
where they are stored, clear only in the process that reads them.

The keys come from ``ASTRAEUS_SECRET_KEY`` (comma-separated Fernet keys) or a key file, one key a
line (``ASTRAEUS_SECRET_KEY_FILE``, by default ``<data_dir>/secret.key``, made 0600 at first
start). The first key encrypts; every key decrypts, so a key is rotated by putting a new one
first, re-encrypting (``astraeus secrets reencrypt``) and then dropping the old one.

Encryption happens at the storage boundary, in the column type ``EncryptedText``: services and
resolvers see clear values, the database never does. The keys are one per process (every server
process of a database needs the same keys), loaded on first use from the settings.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from backend.errors import AstraeusError

if TYPE_CHECKING:
    from backend.config import Settings

# Stored values begin with this, so that a clear value is never taken for a ciphertext.
MARK = "fernet:"
KEY_FILE_NAME = "secret.key"


class KeyUnavailable(AstraeusError):
    """The keys cannot be read, or do not open a stored value: the server's settings are wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(code="ENCRYPTION_KEY", message=message, status=500)


class Keyring:
    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise KeyUnavailable("no encryption key")
        self.keys = tuple(keys)
        try:
            self._fernet = MultiFernet([Fernet(k.encode()) for k in keys])
        except ValueError as error:
            raise KeyUnavailable(
                "an encryption key is not a Fernet key (32 url-safe base64-encoded bytes)"
            ) from error

    def __repr__(self) -> str:
        return f"Keyring({len(self.keys)} keys)"  # never the keys themselves

    @staticmethod
    def new_key() -> str:
        return Fernet.generate_key().decode()

    def encrypt(self, clear: str) -> str:
        return MARK + self._fernet.encrypt(clear.encode()).decode()

    def decrypt(self, stored: str) -> str:
        if not stored.startswith(MARK):
            raise KeyUnavailable("a stored secret is not encrypted")
        try:
            return self._fernet.decrypt(stored.removeprefix(MARK).encode()).decode()
        except InvalidToken as error:
            raise KeyUnavailable(
                "a stored secret does not open with the configured keys "
                "(ASTRAEUS_SECRET_KEY / ASTRAEUS_SECRET_KEY_FILE)"
            ) from error

    def rotate(self, stored: str) -> str:
        """``stored`` encrypted again with the first key."""
        self.decrypt(stored)  # refuses what no key opens
        return MARK + self._fernet.rotate(stored.removeprefix(MARK).encode()).decode()


def key_file(settings: Settings) -> Path:
    return settings.secret_key_file or settings.data_dir / KEY_FILE_NAME


def load_keyring(settings: Settings) -> Keyring:
    """The keys from the settings, or from the key file, which is made (0600) if absent."""
    if settings.secret_key:
        return Keyring([k.strip() for k in settings.secret_key.split(",") if k.strip()])
    path = key_file(settings)
    if not path.exists():
        _make_key_file(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise KeyUnavailable(f"cannot read the key file {path}: {error.strerror}") from error
    return Keyring([line.strip() for line in text.splitlines() if line.strip()])


def _make_key_file(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another process made it first
    with os.fdopen(fd, "w") as f:
        f.write(Keyring.new_key() + "\n")


_lock = threading.Lock()
_keyring: Keyring | None = None


def configure(keyring: Keyring | None) -> None:
    """Use these keys in this process (None: load them from the settings on next use)."""
    global _keyring
    with _lock:
        _keyring = keyring


def keyring() -> Keyring:
    """This process's keys, loaded from ``get_settings()`` on first use."""
    global _keyring
    with _lock:
        if _keyring is None:
            from backend.config import get_settings

            _keyring = load_keyring(get_settings())
        return _keyring


class EncryptedText(TypeDecorator[str]):
    """Text stored encrypted; read and written clear."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else keyring().encrypt(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else keyring().decrypt(value)
