"""Resolvers of idle policies: what a workspace's policies did."""

from __future__ import annotations

from backend.idle import service as idle
from backend.request.context import Info
from backend.schema.idle import IdleAction, IdleReport


async def idle_report(info: Info, days: int = 7, workspace: str | None = None) -> IdleReport:
    principal = info.context.require_principal()
    async with info.context.db.read() as session:
        report = await idle.report(session, info.context.clock, principal, days, workspace)
    return IdleReport(
        since=report.since,
        gpu_hours_given_back=report.gpu_hours_given_back,
        idle_gpu_hours_found=report.idle_gpu_hours_found,
        runs_stopped=report.runs_stopped,
        actions=[
            IdleAction(
                run=d.run,
                action=d.action,
                at=d.at,
                idle_since=d.idle_since,
                gpus=d.gpus,
                reason=d.reason,
                gpu_hours_given_back=d.gpu_hours_given_back,
            )
            for d in report.actions
        ],
    )
