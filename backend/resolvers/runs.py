"""Resolvers of runs: each decodes its input, calls one service, maps the result."""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from strawberry.scalars import JSON

from backend.accounting import counting, viewers
from backend.errors import NotFound
from backend.machines import health
from backend.machines import views as machine_views
from backend.request.context import Info
from backend.resolvers.mutations import mutate
from backend.runs import service as runs
from backend.schema.common import UserError
from backend.schema.machines import (
    Gpu,
    MachineHealthReport,
    MachineHealthRow,
    MachineInfo,
    PoolInfo,
)
from backend.schema.runs import CreateRunPayload, Run, RunPayload


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

    async def work(session: AsyncSession) -> Any:
        return await runs.create_run(
            session, info.context.clock, principal, spec, workspace=workspace
        )

    return await mutate(info, work, _created, _not_created)


async def stop_run(info: Info, name: str, workspace: str | None = None) -> RunPayload:
    return await _change(info, runs.stop_run, name, workspace)


async def delete_run(info: Info, name: str, workspace: str | None = None) -> RunPayload:
    return await _change(info, partial(runs.delete_run, ledger=counting), name, workspace)


async def _change(info: Info, change: Any, name: str, workspace: str | None) -> RunPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> Any:
        return await change(session, info.context.clock, principal, name, workspace=workspace)

    return await mutate(
        info,
        work,
        lambda row: RunPayload(run=Run.from_model(row), errors=[]),
        lambda errors: RunPayload(run=None, errors=errors),
    )


def _created(row: Any) -> CreateRunPayload:
    return CreateRunPayload(run=Run.from_model(row), errors=[])


def _not_created(errors: list[UserError]) -> CreateRunPayload:
    return CreateRunPayload(run=None, errors=errors)


async def gpus(info: Info, workspace: str | None = None) -> list[Gpu]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await machine_views.gpus(session, principal, info.context.clock.now(), workspace)
    return [Gpu.of(g) for g in found]


async def run_again(
    info: Info, name: str, new_name: str, workspace: str | None = None
) -> CreateRunPayload:
    principal = info.context.require_principal()

    async def work(session: AsyncSession) -> Any:
        return await runs.run_again(
            session, info.context.clock, principal, name, new_name, workspace=workspace
        )

    return await mutate(info, work, _created, _not_created)


async def machines(info: Info) -> list[MachineInfo]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await machine_views.machines(session, principal)
    return [MachineInfo.of(m) for m in found]


async def pools(info: Info) -> list[PoolInfo]:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        found = await machine_views.pools(session, principal)
    return [PoolInfo.of(p) for p in found]


async def machine_health(
    info: Info,
    start: datetime | None = None,
    end: datetime | None = None,
    cluster: str | None = None,
) -> MachineHealthReport:
    """Organisation admins: its machines ranked by the GPU time lost on them (the last 7 days
    by default), with their failures, GPU faults and what to do (backend/machines/health.py)."""
    principal = info.context.require_principal()
    period = viewers.period_of(
        start.isoformat() if start else None,
        end.isoformat() if end else None,
        info.context.clock.now(),
    )
    async with info.context.db.read() as session:
        found = await health.machine_health(session, principal, period, cluster)
    return MachineHealthReport(
        start=period.start, end=period.end, machines=[MachineHealthRow.of(h) for h in found]
    )
