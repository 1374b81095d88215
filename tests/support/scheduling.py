"""Machines and asks for the scheduling rules' tests."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from backend.scheduling.placement import GIB, Ask, Holder, MachineRoom
from backend.scheduling.rules import Plan, Quota, plan

NOW = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)


CLUSTER = "gpu-east"


def machine(
    id: int,
    name: str,
    *,
    gpus: int = 8,
    free: Iterable[int] | None = None,
    cpu: float = 64,
    cpu_free: float | None = None,
    memory: int = 512 * GIB,
    memory_free: int | None = None,
    pool: str | None = None,
    state: str = "ready",
    unhealthy: int = 0,
) -> MachineRoom:
    return MachineRoom(
        id=id,
        name=name,
        pool=pool,
        state=state,
        cpu_total=cpu,
        memory_total=memory,
        healthy_gpus=gpus,
        free_gpus=list(range(gpus)) if free is None else list(free),
        cpu_free=cpu if cpu_free is None else cpu_free,
        memory_free=memory if memory_free is None else memory_free,
        unhealthy_gpus=unhealthy,
    )


def ask(
    run_id: int,
    name: str,
    *,
    workers: int = 1,
    gpus: int = 1,
    cpu: float = 1,
    memory: int = 0,
    priority: int = 0,
    queued: int = 0,
    workspace_id: int = 1,
    workspace: str = "vision",
    pool: str | None = None,
    restart_at: datetime | None = None,
) -> Ask:
    return Ask(
        run_id=run_id,
        name=name,
        workspace_id=workspace_id,
        workspace=workspace,
        priority=priority,
        queued_at=NOW - timedelta(hours=1) + timedelta(minutes=queued),
        workers=workers,
        gpus=gpus,
        cpu=cpu,
        memory=memory,
        pool=pool,
        restart_at=restart_at,
    )


def run_plan(
    asks: list[Ask],
    machines: list[MachineRoom],
    holders: list[Holder] | None = None,
    quotas: dict[int, Quota] | None = None,
    used: dict[int, int] | None = None,
    *,
    preempt_over_quota: bool = False,
) -> Plan:
    return plan(
        asks,
        machines,
        holders or [],
        quotas or {},
        used or {},
        NOW,
        cluster=CLUSTER,
        preempt_over_quota=preempt_over_quota,
    )
