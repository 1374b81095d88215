"""Code archives through the API (issue 41), on SQLite and PostgreSQL: an upload is checked
whole before a row is written (its SHA-256 against the digest it is put under, its entries), is
stored once per workspace, is the workspace's alone, is named by a run only in its workspace,
and goes past its retention unless a live run ships with it."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from backend.cli.astra.workdir import pack
from backend.code import service as code
from backend.config import Settings
from backend.db import Database
from backend.models import CodeArchive, CodeChunk, Run
from tests.support import FakeClock, Tenancy, server_settings
from tests.support.api import CREATE, graphql
from tests.support.archives import crafted, entry

RUN_CODE = (
    """query($n: String!) { run(name: $n) { code { digest size files archiveBytes stored } } }"""
)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    # a small limit, so that a body over it is cheap to send
    return server_settings(database_url, tmp_path).model_copy(update={"code_limit_bytes": 2**20})


def project(folder: Path, text: str = "print('hi')\n") -> tuple[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(text)
    packed = pack(folder)
    return f"sha256:{packed.digest}", packed.archive


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/gzip"}


async def stored(db: Database) -> tuple[int, int]:
    async with db.read() as session:
        archives = await session.scalar(select(func.count()).select_from(CodeArchive))
        chunks = await session.scalar(select(func.count()).select_from(CodeChunk))
    return int(archives or 0), int(chunks or 0)


async def test_an_upload_is_stored_once_and_is_its_workspaces_alone(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy, tmp_path: Path
) -> None:
    digest, body = project(tmp_path / "p")
    put = await client.put(f"/v1/code/{digest}", content=body, headers=auth(tenancy.member_token))
    assert put.status_code == 201, put.text
    assert put.json() | {"uploaded_at": None} == {
        "digest": digest,
        "size": len("print('hi')\n"),
        "files": 1,
        "archive_bytes": len(body),
        "uploaded_at": None,
        "stored": True,
    }
    again = await client.put(f"/v1/code/{digest}", content=body, headers=auth(tenancy.member_token))
    assert (again.status_code, again.json()["stored"]) == (200, False)
    assert await stored(db) == (1, 1)
    got = await client.get(f"/v1/code/{digest}", headers=auth(tenancy.member_token))
    assert got.json()["digest"] == digest
    # another workspace: the same answer as for a digest nobody has
    for token in (tenancy.other_token, tenancy.foreign_token):
        hidden = await client.get(f"/v1/code/{digest}", headers=auth(token))
        assert hidden.status_code == 404
        assert hidden.json() == {
            "code": "CODE_NOT_FOUND",
            "message": f"No code {digest} in this workspace.",
        }
    # its own upload of the same content is its own copy
    theirs = await client.put(f"/v1/code/{digest}", content=body, headers=auth(tenancy.other_token))
    assert theirs.status_code == 201
    assert await stored(db) == (2, 2)
    nobody = await client.put(f"/v1/code/{digest}", content=body)
    assert nobody.status_code == 401


async def test_the_same_archive_uploaded_twice_at_once_is_one_copy(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy, tmp_path: Path
) -> None:
    digest, body = project(tmp_path / "p")
    answers = await asyncio.gather(
        *(
            client.put(f"/v1/code/{digest}", content=body, headers=auth(tenancy.member_token))
            for _ in range(2)
        )
    )
    assert sorted(a.status_code for a in answers) == [200, 201]
    assert await stored(db) == (1, 1)


async def test_a_bad_upload_is_refused_naming_why_and_writes_nothing(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy, tmp_path: Path
) -> None:
    digest, body = project(tmp_path / "p")
    headers = auth(tenancy.member_token)
    other = "sha256:" + "0" * 64
    mismatch = await client.put(f"/v1/code/{other}", content=body, headers=headers)
    assert (mismatch.status_code, mismatch.json()["code"]) == (400, "DIGEST_MISMATCH")
    assert mismatch.json()["errors"] == [
        {"field": "digest", "reason": f"the body's SHA-256 is {digest}, not it"}
    ]
    malformed = await client.put("/v1/code/sha256:xyz", content=body, headers=headers)
    assert malformed.json()["errors"] == [
        {
            "field": "digest",
            "reason": "must be sha256: and 64 hexadecimal digits, the SHA-256 of the archive",
        }
    ]
    # a crafted archive: a name that leaves its folder
    evil = crafted(entry("../../etc/cron.d/evil"))
    named = f"sha256:{hashlib.sha256(evil).hexdigest()}"
    refused = await client.put(f"/v1/code/{named}", content=evil, headers=headers)
    assert (refused.status_code, refused.json()["code"]) == (400, "INVALID_ARCHIVE")
    assert refused.json()["errors"][0]["reason"] == (
        "the entry '../../etc/cron.d/evil' would be unpacked outside its folder: a run's code "
        "is a gzip'd tar (astra astraeus submit --workdir)"
    )
    # over the server's limit: refused before it is read
    big = b"\0" * (3 * 2**20)
    large = await client.put(
        f"/v1/code/sha256:{hashlib.sha256(big).hexdigest()}", content=big, headers=headers
    )
    assert (large.status_code, large.json()["code"]) == (413, "PAYLOAD_TOO_LARGE")

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: cut as it streams
        for _ in range(3):
            yield b"\0" * 2**20

    streamed = await client.put(f"/v1/code/{other}", content=chunked(), headers=headers)
    assert (streamed.status_code, streamed.json()["code"]) == (413, "PAYLOAD_TOO_LARGE")
    assert await stored(db) == (0, 0)


async def test_a_run_names_only_its_workspaces_code_and_shows_it(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy, tmp_path: Path
) -> None:
    digest, body = project(tmp_path / "p")
    await client.put(f"/v1/code/{digest}", content=body, headers=auth(tenancy.member_token))
    spec = {"name": "shipped", "command": ["python", "train.py"], "code": digest}
    theirs = await graphql(client, tenancy.other_token, CREATE, spec=spec)
    assert theirs["data"]["createRun"]["errors"] == [
        {
            "code": "CODE_NOT_FOUND",
            "field": "code",
            "message": f"no code {digest[:19]}… in this workspace: upload it first (astra "
            "astraeus submit --workdir FOLDER does both)",
        }
    ]
    wrong = await graphql(client, tenancy.member_token, CREATE, spec=spec | {"code": "abc"})
    assert wrong["data"]["createRun"]["errors"][0]["field"] == "code"
    made = await graphql(client, tenancy.member_token, CREATE, spec=spec)
    assert made["data"]["createRun"]["errors"] == []
    shown = await graphql(client, tenancy.member_token, RUN_CODE, n="shipped")
    assert shown["data"]["run"]["code"] == {
        "digest": digest,
        "size": 12,
        "files": 1,
        "archiveBytes": len(body),
        "stored": True,
    }
    job = await client.get("/v1/jobs/shipped", headers=auth(tenancy.member_token))
    assert job.json()["code"] == {"digest": digest, "size": 12, "files": 1, "stored": True}
    assert job.json()["spec"]["code"] == digest


async def test_code_past_its_retention_goes_unless_a_live_run_ships_with_it(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy, tmp_path: Path
) -> None:
    headers = auth(tenancy.member_token)
    used, used_body = project(tmp_path / "used")
    idle, idle_body = project(tmp_path / "idle", "print('never run')\n")
    for digest, body in ((used, used_body), (idle, idle_body)):
        await client.put(f"/v1/code/{digest}", content=body, headers=headers)
    spec = {"name": "live", "command": ["python", "train.py"], "code": used}
    await graphql(client, tenancy.member_token, CREATE, spec=spec)
    clock.advance(days=code.RETENTION.days + 1)
    async with db.transaction() as session:
        assert await code.prune(session, clock) == 1  # the one no run ships with
    assert await stored(db) == (1, 1)
    async with db.transaction() as session:  # the run ends: its code goes at the next prune
        run = await session.scalar(select(Run).where(Run.name == "live"))
        assert run is not None
        run.state = "Completed"
    async with db.transaction() as session:
        assert await code.prune(session, clock) == 1
    assert await stored(db) == (0, 0)
    shown = await graphql(client, tenancy.member_token, RUN_CODE, n="live")
    assert shown["data"]["run"]["code"] == {
        "digest": used,
        "size": None,
        "files": None,
        "archiveBytes": None,
        "stored": False,
    }
    again = await graphql(client, tenancy.member_token, CREATE, spec=spec | {"name": "again"})
    assert again["data"]["createRun"]["errors"][0]["code"] == "CODE_NOT_FOUND"
