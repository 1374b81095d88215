"""``/code/<digest>``: a run's code, uploaded by `astra astraeus submit --workdir` (PUT, the
gzip'd tar as the body) and looked up (GET) before an upload it would make twice (issue 41).

An upload is read outside any transaction, into a spooled file (memory up to a few MiB, then
disk), its SHA-256 taken as it comes; its digest and contents are checked (backend/code/rules.py)
before a row is written, so a refused upload writes nothing. A workspace uploads at most
UPLOADS_AT_ONCE archives at a time: uploads spool to the server's disk."""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections import Counter
from typing import IO

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from backend.access import service as access
from backend.clock import Clock, iso_z
from backend.code import service as code
from backend.code.rules import ArchiveFacts, ArchiveRefused, check_archive, digest_of
from backend.config import Settings
from backend.db import Database
from backend.errors import AstraeusError, FieldError, InvalidInput
from backend.models import CodeArchive
from backend.organizations import service as organizations
from backend.rest import answers
from backend.rest.base import (
    Call,
    bearer,
    endpoint,
    error_response,
    guarded,
    refused_parameters,
)
from backend.rest.parameters import CodePath, JobQuery

SPOOL_IN_MEMORY = 4 * 2**20
UPLOADS_AT_ONCE = 2


class TooManyUploads(AstraeusError):
    def __init__(self) -> None:
        super().__init__(
            code="TOO_MANY_UPLOADS",
            message=f"This workspace is uploading {UPLOADS_AT_ONCE} archives already: try "
            "again once one is done.",
            status=429,
        )


def code_json(row: CodeArchive, stored: bool) -> answers.Code:
    return answers.Code(
        digest=digest_of(row.digest),
        size=row.size,
        files=row.files,
        archive_bytes=row.archive_bytes,
        uploaded_at=iso_z(row.uploaded_at),
        stored=stored,
    )


async def get_code(call: Call) -> Response:
    digest = CodePath.of(call.request).digest
    workspace = JobQuery.of(call.request).workspace
    row = await code.find(call.session, call.principal, digest, workspace)
    return code_json(row, stored=False).response()


async def put_code(request: Request) -> Response:
    refused = refused_parameters(request)
    if refused:
        return error_response(InvalidInput("INVALID_PARAMETER", refused))
    return await guarded(request, lambda: _upload(request))


async def _upload(request: Request) -> Response:
    db: Database = request.app.state.db
    clock: Clock = request.app.state.clock
    settings: Settings = request.app.state.settings
    hex_digest = code.parse_digest(CodePath.of(request).digest)
    async with db.read() as session:
        principal = await access.authenticate(session, bearer(request), clock.now())
        workspace = JobQuery.of(request).workspace
        ws = await organizations.workspace_for(session, principal, workspace)
    request.app.state.token_uses.note(principal, clock.now())
    uploading: Counter[int] = request.app.state.code_uploads
    if uploading[ws.id] >= UPLOADS_AT_ONCE:
        raise TooManyUploads()
    uploading[ws.id] += 1
    try:
        with tempfile.SpooledTemporaryFile(SPOOL_IN_MEMORY) as body:
            seen, archive_bytes = await _receive(request, body)
            if seen != hex_digest:
                raise InvalidInput(
                    "DIGEST_MISMATCH",
                    [FieldError("digest", f"the body's SHA-256 is {digest_of(seen)}, not it")],
                )
            facts = await asyncio.to_thread(_checked, body, settings.code_limit_bytes)

            async def keep(session: AsyncSession) -> code.Stored:
                return await code.store(
                    session, clock, ws.id, hex_digest, body, archive_bytes, facts
                )

            try:
                stored = await db.unit(keep)
            except IntegrityError:  # the same archive, uploaded at once beside: one copy
                stored = await db.unit(keep)
    except ClientDisconnect:
        return Response(status_code=400)  # nobody to read it
    finally:
        uploading[ws.id] -= 1
        if not uploading[ws.id]:
            del uploading[ws.id]
    return code_json(stored.archive, stored.created).response(201 if stored.created else 200)


async def _receive(request: Request, body: IO[bytes]) -> tuple[str, int]:
    """The body into ``body``: its SHA-256 (hex) and size. Its size is bounded by the server's
    BodyLimit for this path (backend/app.py)."""
    digest = hashlib.sha256()
    size = 0
    async for piece in request.stream():
        digest.update(piece)
        size += len(piece)
        body.write(piece)
    return digest.hexdigest(), size


def _checked(body: IO[bytes], limit: int) -> ArchiveFacts:
    body.seek(0)
    try:
        return check_archive(body, limit)
    except ArchiveRefused as refused:
        reason = f"{refused}: a run's code is a gzip'd tar (astra astraeus submit --workdir)"
        raise InvalidInput("INVALID_ARCHIVE", [FieldError("archive", reason)]) from None


routes = [
    Route("/code/{digest}", endpoint(get_code), methods=["GET"]),
    Route("/code/{digest}", put_code, methods=["PUT"]),
]
