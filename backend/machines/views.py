"""What a workspace sees of the machines: every GPU with its utilisation now, its health and
which run holds it (seed L-39: `gpu-07/0  NVIDIA H100 80GB HBM3  97%  ok  held by llama-sft`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.errors import Forbidden
from backend.machines import repository, rules
from backend.metrics import service as metrics
from backend.organizations import service as organizations

UTILIZATION = "task_gpu_utilization_ratio"
# The machines a workspace's members see (GPUs, a run's per-machine reasons): those its runs
# may be placed on now or later. Lost and removed machines are the organisation admins' alone.
MEMBERS_SEE = ("ready", "draining")


@dataclass(frozen=True)
class GpuView:
    machine: str
    index: int
    model: str
    memory_bytes: int
    health: str
    health_reason: str
    # Mean of its newest sample (the last two minutes), 0 when free; None: held, not sampled.
    utilization: float | None
    held_by: str | None  # the run, when it is the caller's workspace's
    held_elsewhere: bool  # held by a run of another workspace (not named)

    @property
    def line(self) -> str:
        """The seed's `astra astraeus gpus` line."""
        use = "—" if self.utilization is None else f"{round(self.utilization * 100)}%"
        holder = (
            f"held by {self.held_by}"
            if self.held_by
            else "held by another workspace"
            if self.held_elsewhere
            else "free"
        )
        return f"{self.machine}/{self.index}  {self.model}  {use}  {self.health}  {holder}"


async def gpus(
    session: AsyncSession, principal: Principal, now: datetime, workspace: str | None = None
) -> list[GpuView]:
    """Every GPU of the organisation's clusters (where the workspace's runs may go); a run of
    another workspace that holds one is not named. Members see the machines in MEMBERS_SEE."""
    ws = await organizations.workspace_for(session, principal, workspace)
    clusters = await organizations.clusters(session, ws.organization_id)
    found = await repository.gpus_in_clusters(session, [c.id for c in clusters])
    machine_ids = sorted({m.id for _, m in found})
    held: dict[tuple[int, int], tuple[int, str, int]] = {}  # (machine, gpu) → worker, run, ws
    for worker, run in await repository.holders(session, machine_ids):
        for index in worker.gpu_ids or []:
            held[(worker.machine_id or 0, index)] = (worker.id, run.name, run.workspace_id)
    latest = await metrics.latest(session, sorted({w for w, _, _ in held.values()}), now)
    out = []
    for gpu, machine in found:
        if machine.state not in MEMBERS_SEE and not principal.is_org_admin:
            continue
        holder = held.get((machine.id, gpu.index))
        utilization: float | None = 0.0
        if holder is not None:
            per_gpu = latest.get(holder[0], {}).get(UTILIZATION)
            utilization = per_gpu.get(str(gpu.index)) if isinstance(per_gpu, dict) else None
        mine = holder is not None and holder[2] == ws.id
        out.append(
            GpuView(
                machine=machine.name,
                index=gpu.index,
                model=gpu.model,
                memory_bytes=gpu.memory_bytes,
                health=gpu.health,
                health_reason=gpu.health_reason,
                utilization=utilization if holder is None or mine else None,
                held_by=holder[1] if holder is not None and mine else None,
                held_elsewhere=holder is not None and not mine,
            )
        )
    return out


@dataclass(frozen=True)
class MachineView:
    name: str
    cluster: str
    pool: str | None
    state: str
    reason: str
    cpu_cores: float
    memory_bytes: int
    gpus: int
    unhealthy_gpus: int
    last_seen_at: datetime | None
    address: str | None = None
    executor: str | None = None
    isolation: str = ""  # what of its workers' sandbox it enforces, and what not (rules)
    isolation_not_enforced: tuple[str, ...] = ()


async def machines(session: AsyncSession, principal: Principal) -> list[MachineView]:
    """Every machine of the organisation's clusters, for its admins (seed: machines and pools
    are the organisation admins')."""
    if not principal.is_org_admin:
        raise Forbidden("Only the organisation's admins see its machines; GPUs are in gpus.")
    clusters = await organizations.clusters(session, principal.organization_id)
    return [
        MachineView(
            name=m.name,
            cluster=cluster,
            pool=pool,
            state=m.state,
            reason=m.reason,
            cpu_cores=m.cpu_cores,
            memory_bytes=m.memory_bytes,
            gpus=gpus_count,
            unhealthy_gpus=unhealthy,
            last_seen_at=m.last_seen_at,
            address=m.address,
            executor=m.executor,
            isolation=rules.isolation_sentence(m.executor, m.isolation),
            isolation_not_enforced=tuple(rules.isolation_not_enforced(m.executor, m.isolation)),
        )
        for m, cluster, pool, gpus_count, unhealthy in await repository.machines_in_clusters(
            session, [c.id for c in clusters]
        )
    ]


@dataclass(frozen=True)
class PoolView:
    name: str
    cluster: str
    machines: int
    gpus: int
    unhealthy_gpus: int
    # What a GPU-hour here costs (issue 23), in currency; None: no price.
    gpu_hour_price: float | None = None
    currency: str | None = None
    # The idle policy a run submitted to it without its own takes (issue 41); None: none.
    idle_policy: dict[str, Any] | None = None


async def pools(session: AsyncSession, principal: Principal) -> list[PoolView]:
    """The organisation's pools with their machines and GPUs, for its admins; the machines in
    no pool are not a pool and are not listed."""
    found: dict[tuple[str, str], list[MachineView]] = {}
    for m in await machines(session, principal):
        if m.pool is not None:
            found.setdefault((m.cluster, m.pool), []).append(m)
    prices: dict[tuple[str, str], tuple[float | None, str | None]] = {}
    idle: dict[tuple[str, str], dict[str, Any] | None] = {}
    for cluster, name, price, currency, policy in await repository.pool_names(
        session,
        [c.id for c in await organizations.clusters(session, principal.organization_id)],
    ):
        found.setdefault((cluster, name), [])
        prices[(cluster, name)] = (price, currency)
        idle[(cluster, name)] = policy
    return [
        PoolView(
            name=name,
            cluster=cluster,
            machines=len(members),
            gpus=sum(m.gpus for m in members),
            unhealthy_gpus=sum(m.unhealthy_gpus for m in members),
            gpu_hour_price=prices.get((cluster, name), (None, None))[0],
            currency=prices.get((cluster, name), (None, None))[1],
            idle_policy=idle.get((cluster, name)),
        )
        for (cluster, name), members in sorted(found.items())
    ]
