"""Secret values and webhook secrets are stored encrypted: the database never holds them clear,
the services read them clear, a rotated key still opens them, and 0017 encrypts old rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import select, text

from alembic import command
from backend import crypto, migrations
from backend.access import service as access
from backend.db import Database
from backend.models import Secret, Webhook
from backend.secrets import service as secrets
from backend.webhooks import service as webhooks
from tests.support import FakeClock, Tenancy

VALUE = "hf_live_0123456789abcdefSECRET"


async def _stored(db: Database, query: str) -> list[str]:
    async with db.read() as session:
        return [str(v) for v in (await session.execute(text(query))).scalars()]


async def test_secret_values_and_webhook_secrets_are_stored_encrypted_and_read_clear(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    async with db.transaction() as session:
        member = await access.authenticate(session, tenancy.member_token, clock.now())
        await secrets.set_secret(session, clock, member, "hf-token", VALUE)
        hook = await webhooks.create_webhook(session, clock, member, "https://hooks.example.com/a")
        signing = hook.secret
    assert signing.startswith("whsec_")
    stored = await _stored(db, "SELECT value FROM secrets") + await _stored(
        db, "SELECT secret FROM webhooks"
    )
    assert len(stored) == 2
    for raw in stored:
        assert raw.startswith(crypto.MARK)
        assert VALUE not in raw and signing not in raw
    async with db.read() as session:
        assert await session.scalar(select(Secret.value)) == VALUE
        assert await session.scalar(select(Webhook.secret)) == signing


def test_a_rotated_key_opens_old_values_and_re_encrypts_them_with_the_new_one() -> None:
    old_key, new_key = (crypto.Fernet.generate_key().decode() for _ in range(2))
    stored = crypto.Keyring([old_key]).encrypt(VALUE)
    rotated = crypto.Keyring([new_key, old_key])
    assert rotated.decrypt(stored) == VALUE
    again = rotated.rotate(stored)
    assert crypto.Keyring([new_key]).decrypt(again) == VALUE
    with pytest.raises(crypto.KeyUnavailable):
        crypto.Keyring([new_key]).decrypt(stored)
    with pytest.raises(crypto.KeyUnavailable):
        rotated.decrypt(VALUE)  # a clear value is never taken for a ciphertext


def test_the_key_file_is_made_once_readable_only_by_its_user(tmp_path: Path) -> None:
    from backend.config import Settings

    settings = Settings(data_dir=tmp_path / "data")
    first = crypto.load_keyring(settings).encrypt(VALUE)
    path = tmp_path / "data" / "secret.key"
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o700
    assert crypto.load_keyring(settings).decrypt(first) == VALUE  # the same key, kept
    given = Settings(data_dir=tmp_path / "other", secret_key=crypto.Fernet.generate_key().decode())
    crypto.load_keyring(given)
    assert not (tmp_path / "other").exists()  # a key from the settings: no file made


def test_0017_encrypts_the_values_stored_clear_before_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'astraeus.db'}"
    migrations.upgrade(url, "0016")
    with sqlite3.connect(tmp_path / "astraeus.db") as conn:
        conn.execute(
            "INSERT INTO organizations (id, name, created_at) VALUES (1, 'o', '2026-01-01')"
        )
        conn.execute(
            "INSERT INTO workspaces (id, organization_id, name, created_at) "
            "VALUES (1, 1, 'w', '2026-01-01')"
        )
        conn.execute(
            "INSERT INTO secrets (workspace_id, name, value, external, created_at, updated_at) "
            "VALUES (1, 'A', ?, 0, '2026-01-01', '2026-01-01'), "
            "(1, 'B', NULL, 1, '2026-01-01', '2026-01-01')",
            (VALUE,),
        )
        conn.execute(
            "INSERT INTO webhooks (workspace_id, url, secret, kinds, cursor, horizon, created_at) "
            "VALUES (1, 'https://h.example.com', 'whsec_clear', '[]', 0, 0, '2026-01-01')"
        )
    migrations.upgrade(url)
    raw = (tmp_path / "astraeus.db").read_bytes()
    assert VALUE.encode() not in raw and b"whsec_clear" not in raw
    with sqlite3.connect(tmp_path / "astraeus.db") as conn:
        values = dict(conn.execute("SELECT name, value FROM secrets").fetchall())
        (hook,) = conn.execute("SELECT secret FROM webhooks").fetchone()
    assert values["B"] is None
    assert crypto.keyring().decrypt(values["A"]) == VALUE
    assert crypto.keyring().decrypt(hook) == "whsec_clear"
    # and back down: clear again
    command.downgrade(migrations.alembic_config(url), "0016")
    with sqlite3.connect(tmp_path / "astraeus.db") as conn:
        assert conn.execute("SELECT value FROM secrets WHERE name = 'A'").fetchone() == (VALUE,)


async def test_reencrypt_moves_every_stored_secret_to_the_first_key(
    db: Database, clock: FakeClock, tenancy: Tenancy, encryption_keys: crypto.Keyring
) -> None:
    async with db.transaction() as session:
        member = await access.authenticate(session, tenancy.member_token, clock.now())
        await secrets.set_secret(session, clock, member, "hf-token", VALUE)
        hook = await webhooks.create_webhook(session, clock, member, "https://hooks.example.com/a")
        signing = hook.secret
    before = await _stored(db, "SELECT value FROM secrets")
    new_key = crypto.Fernet.generate_key().decode()
    try:
        crypto.configure(crypto.Keyring([new_key, *encryption_keys.keys]))
        async with db.transaction() as session:
            assert await secrets.reencrypt(session) == 2
        crypto.configure(crypto.Keyring([new_key]))  # the old key dropped
        async with db.read() as session:
            assert await session.scalar(select(Secret.value)) == VALUE
            assert await session.scalar(select(Webhook.secret)) == signing
        assert await _stored(db, "SELECT value FROM secrets") != before
    finally:
        crypto.configure(encryption_keys)


def test_astraeus_secrets_reencrypt_after_a_new_key_is_put_first_in_the_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encryption_keys: crypto.Keyring
) -> None:
    from backend.cli.server import main
    from backend.config import get_settings

    data = tmp_path / "data"
    data.mkdir()
    old_key, new_key = crypto.Keyring.new_key(), crypto.Keyring.new_key()
    (data / "secret.key").write_text(old_key + "\n")
    migrations.upgrade(f"sqlite:///{data / 'astraeus.db'}")
    with sqlite3.connect(data / "astraeus.db") as conn:
        conn.execute(
            "INSERT INTO organizations (id, name, created_at) VALUES (1, 'o', '2026-01-01')"
        )
        conn.execute(
            "INSERT INTO workspaces (id, organization_id, name, created_at) "
            "VALUES (1, 1, 'w', '2026-01-01')"
        )
        conn.execute(
            "INSERT INTO secrets (workspace_id, name, value, external, created_at, updated_at) "
            "VALUES (1, 'a', ?, 0, '2026-01-01', '2026-01-01')",
            (crypto.Keyring([old_key]).encrypt(VALUE),),
        )
    (data / "secret.key").write_text(f"{new_key}\n{old_key}\n")
    monkeypatch.setenv("ASTRAEUS_DATA_DIR", str(data))
    monkeypatch.delenv("ASTRAEUS_DATABASE_URL", raising=False)
    monkeypatch.delenv("ASTRAEUS_SECRET_KEY", raising=False)
    get_settings.cache_clear()
    try:
        assert main(["secrets", "reencrypt"]) == 0
    finally:
        get_settings.cache_clear()
        crypto.configure(encryption_keys)
    with sqlite3.connect(data / "astraeus.db") as conn:
        (stored,) = conn.execute("SELECT value FROM secrets").fetchone()
    assert crypto.Keyring([new_key]).decrypt(stored) == VALUE  # the old key may go
