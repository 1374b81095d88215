"""Resolvers of runs: each decodes its input, calls one service, maps the result."""

from __future__ import annotations

from strawberry.scalars import JSON

from backend.errors import AstraeusError, NotFound
from backend.resolvers.context import Info
from backend.runs import service as runs
from backend.schema.common import UserError
from backend.schema.runs import CreateRunPayload, Run


async def run(info: Info, name: str, workspace: str | None = None) -> Run | None:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        try:
            row = await runs.get_run(session, principal, name, workspace=workspace)
        except NotFound:
            return None
    return Run.from_model(row)


async def list_runs(info: Info, all: bool = False, workspace: str | None = None) -> list[Run]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        rows = await runs.list_runs(session, principal, include_ended=all, workspace=workspace)
    return [Run.from_model(r) for r in rows]


async def create_run(info: Info, spec: JSON, workspace: str | None = None) -> CreateRunPayload:
    principal = info.context.require_principal()
    try:
        async with info.context.db.transaction() as session:
            row = await runs.create_run(
                session, info.context.clock, principal, spec, workspace=workspace
            )
    except AstraeusError as error:
        return CreateRunPayload(run=None, errors=UserError.from_error(error))
    return CreateRunPayload(run=Run.from_model(row), errors=[])
