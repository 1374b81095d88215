"""The machines domain's entry point: what an agent registers, its lease, drains, GPU faults."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.clock import Clock
from backend.db.commit_jobs import after_commit
from backend.errors import Conflict, FieldError, NotFound
from backend.job_names import PASS_JOB
from backend.lifecycle import service as lifecycle
from backend.lifecycle.sentences import EndCause
from backend.lifecycle.views import Effects
from backend.machines import repository, rules
from backend.models import Gpu, GpuFault, Machine, Worker
from backend.organizations import service as organizations

log = logging.getLogger(__name__)

SIMULATED_GPU_MODEL = "Simulated GPU"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    memory_bytes: int
    healthy: bool = True
    health_reason: str = ""


async def register(
    session: AsyncSession,
    clock: Clock,
    *,
    cluster_id: int,
    name: str,
    cpu_cores: float,
    memory_bytes: int,
    gpus: list[GpuInfo],
    lease: timedelta,
    pool: str | None = None,
    address: str | None = None,
    executor: str | None = None,
    unmeasured_metrics: Sequence[str] = (),
    isolation: dict[str, Any] | None = None,
) -> Machine:
    """A machine's agent says what it has; a known machine is updated and its lease renewed.
    ``address`` is where other machines reach it (checked by rules.address_problem); without
    one (an agent before it was sent) gangs are told the machine's name, as before."""
    now = clock.now()
    if await repository.get_cluster(session, cluster_id) is None:
        raise NotFound("CLUSTER_NOT_FOUND", "No such cluster.")
    machine = await repository.get_machine(session, cluster_id, name)
    if executor == rules.SLURM:
        return await _register_node_agent(
            session, clock, cluster_id, name, machine, gpus, lease, address, unmeasured_metrics
        )
    pool_row = await repository.get_or_create_pool(session, cluster_id, pool, now) if pool else None
    if machine is None:
        machine = Machine(cluster_id=cluster_id, name=name, created_at=now, labels={})
        repository.add(session, machine)
    machine.pool_id = pool_row.id if pool_row else None
    machine.cpu_cores = cpu_cores
    machine.memory_bytes = memory_bytes
    machine.address = address or None
    # How its agent runs workers (a run naming an image fits only "docker") and what it cannot
    # measure per worker (the API and console say "Not measured" for those).
    machine.executor = executor
    machine.unmeasured_metrics = list(unmeasured_metrics)
    # What of its workers' sandbox it enforces (rules.isolation_sentence says it).
    machine.isolation = isolation
    if machine.state not in ("draining",):
        machine.state, machine.reason = "ready", "Registered"
    machine.last_seen_at = now
    machine.lease_expires_at = now + lease
    await session.flush()
    await repository.delete_rows(session, *await _write_gpus(session, machine, gpus))
    await session.flush()
    return machine


async def executor_refusal(session: AsyncSession, cluster_id: int, executor: str) -> str | None:
    """Why an agent of this executor may not join the cluster (rules.executor_refusal)."""
    cluster = await repository.get_cluster(session, cluster_id)
    if cluster is None:
        return None  # registering says there is no such cluster
    return rules.executor_refusal(executor, cluster.name, cluster.slurm is not None)


async def _register_node_agent(
    session: AsyncSession,
    clock: Clock,
    cluster_id: int,
    name: str,
    machine: Machine | None,
    gpus: list[GpuInfo],
    lease: timedelta,
    address: str | None,
    unmeasured_metrics: Sequence[str],
) -> Machine:
    """A Slurm node's agent joins: Slurm says what the node is (its state, partition, cores,
    memory and GPU count: the import writes them), the agent where it is reached, what it
    cannot measure, and its GPUs' own names and memory. Its lease says whether it is connected,
    never that the node is lost: Slurm says that, and Slurm ends the node's jobs."""
    now = clock.now()
    if machine is None:  # its agent came before the import listed the node
        machine = Machine(
            cluster_id=cluster_id,
            name=name,
            created_at=now,
            labels={},
            executor=rules.SLURM,
            state="ready",
            reason="Its agent joined; Slurm has not listed it yet",
        )
        repository.add(session, machine)
    machine.address = address or None
    machine.unmeasured_metrics = list(unmeasured_metrics)
    machine.last_seen_at = now
    machine.lease_expires_at = now + lease
    await session.flush()
    await _write_gpus(session, machine, gpus)  # the import removes those Slurm does not give it
    await session.flush()
    return machine


async def _write_gpus(session: AsyncSession, machine: Machine, gpus: list[GpuInfo]) -> list[Gpu]:
    """The machine's GPUs as its agent says them; the rows of those it did not list."""
    known = {g.index: g for g in await repository.gpus_of(session, machine.id)}
    for info in gpus:
        row = known.pop(info.index, None)
        if row is None:
            row = Gpu(machine_id=machine.id, index=info.index)
            repository.add(session, row)
        row.uuid, row.model, row.memory_bytes = info.uuid, info.model, info.memory_bytes
        row.health = "ok" if info.healthy else "unhealthy"
        row.health_reason = info.health_reason
    return list(known.values())


async def heartbeat(session: AsyncSession, clock: Clock, machine_id: int, lease: timedelta) -> bool:
    """Renew the lease. False when the machine was already lost: it must register again."""
    now = clock.now()
    return await repository.extend_lease(session, machine_id, now, now + lease)


# The most machines whose leases one statement renews (a bound on its parameters).
RENEW_BATCH = 5000


@dataclass(frozen=True)
class Renewal:
    """What a renewal of leases found: machines already lost (they must register again), and
    machines whose rows another transaction held (not waited for: renewed next time)."""

    lost: set[int]
    held: set[int]


async def renew_leases(
    session: AsyncSession, clock: Clock, heard: Mapping[int, datetime], lease: timedelta
) -> Renewal:
    """Renew the leases of machines heard from, a batch a statement (one for a replica's
    machines, up to thousands), never waiting behind another transaction's write of a
    machine (issue 19: one held row kept a thousand leases from being renewed). Each is
    recorded last seen when it was last heard (``heard``), its lease a whole one from now."""
    now = clock.now()
    ids = sorted(heard)
    renewed: set[int] = set()
    held: set[int] = set()
    for start in range(0, len(ids), RENEW_BATCH):
        batch = {m: min(heard[m], now) for m in ids[start : start + RENEW_BATCH]}
        done, busy = await repository.renew_leases(session, batch, now + lease)
        renewed |= done
        held |= busy
    return Renewal(lost=set(ids) - renewed - held, held=held)


async def expire_leases(session: AsyncSession, clock: Clock, lease: timedelta) -> Effects:
    """Machines whose agent missed its heartbeats are lost; their workers fail with them.

    A lease is what the database says: the replica holding a machine's stream renews it
    while it hears from the machine (backend/gateway/leases.py), so a machine held by a live
    stream on any replica is not expired, and one whose replica died is lost a lease later.

    Unless the check before this one is more than half a lease ago: then nothing could check
    leases meanwhile, most likely because the database was away, and no agent could renew
    its lease either. Every machine gets a whole lease to be heard from again instead (a
    machine that really died meanwhile is found lost one lease later)."""
    now = clock.now()
    previous = await repository.record_lease_check(session, now)
    if previous is not None and now - previous > lease / 2:
        renewed = await repository.extend_all_leases(session, now + lease)
        log.warning(
            "leases were last checked %ds ago: %d machines get a whole lease to report again",
            (now - previous).total_seconds(),
            renewed,
        )
        return Effects()
    total = Effects()
    for machine in await repository.expired_machines(session, now):
        assert machine.lease_expires_at is not None
        log.warning(
            "machine %s lost: its lease expired %.1fs ago (last heard %s)",
            machine.name,
            (now - machine.lease_expires_at).total_seconds(),
            machine.last_seen_at.isoformat() if machine.last_seen_at else "never",
        )
        machine.state, machine.reason = "lost", "Machine lost: its lease expired"
        # Its workers are lost from its last contact, not from now: the time since was theirs
        # to lose (failure), not idle (issue 36).
        fx = await lifecycle.machine_lost(session, clock, machine.id, machine.last_seen_at)
        total.freed |= fx.freed
    return total


async def lose(
    session: AsyncSession, clock: Clock, cluster_id: int, name: str, reason: str
) -> Effects:
    """The machine is lost now (its credential was revoked): its workers fail with it and are
    placed elsewhere, as for an expired lease. A machine never registered changes nothing."""
    machine = await repository.get_machine(session, cluster_id, name)
    if machine is None:
        return Effects()
    if machine.executor == rules.SLURM:
        machine.lease_expires_at = clock.now()  # its agent is gone; Slurm still runs its jobs
        return Effects()
    machine.state, machine.reason = "lost", reason
    machine.lease_expires_at = clock.now()
    await session.flush()
    return await lifecycle.machine_lost(session, clock, machine.id)


async def grant_restart_grace(session: AsyncSession, clock: Clock, lease: timedelta) -> int:
    """An agent endpoint (re)started: every machine gets a whole lease to reconnect to it.

    Machines cannot renew their leases while no endpoint takes their streams; without this a
    server down for longer than a lease would find every machine lost when it came back."""
    return await repository.extend_all_leases(session, clock.now() + lease)


async def drain(session: AsyncSession, clock: Clock, machine: Machine) -> Effects:
    """Take no new work; its runs are preempted and queued again elsewhere."""
    machine.state, machine.reason = "draining", "Drained by an operator"
    after_commit(session, PASS_JOB)  # its runs wait to be placed again elsewhere
    return await lifecycle.machine_drained(session, clock, machine.id, machine.name)


async def machine_id(session: AsyncSession, cluster_id: int, name: str) -> int | None:
    """The id of the cluster's machine of this name; None where it has none."""
    machine = await repository.get_machine(session, cluster_id, name)
    return None if machine is None else machine.id


async def drain_by_name(
    session: AsyncSession, clock: Clock, principal: Principal, cluster: str, name: str
) -> tuple[Machine, Effects]:
    """An organisation admin drains a machine of one of its clusters; anyone else is told
    there is no such machine."""
    hidden = NotFound("MACHINE_NOT_FOUND", f"No machine named '{name}' in cluster '{cluster}'.")
    if not principal.is_org_admin:
        raise hidden
    clusters = await organizations.clusters(session, principal.organization_id)
    found = next((c for c in clusters if c.name == cluster), None)
    machine = await repository.get_machine(session, found.id, name) if found else None
    if machine is None:
        raise hidden
    if machine.executor == rules.SLURM:
        raise Conflict(
            "MACHINE_RUN_BY_SLURM",
            f"{name} is a node of cluster {cluster}, which Slurm runs: drain it in Slurm "
            f"(scontrol update nodename={name} state=drain reason=...).",
            [FieldError("machine", "is a Slurm node: Slurm places work on it")],
        )
    return machine, await drain(session, clock, machine)


async def gpu_fault(
    session: AsyncSession,
    clock: Clock,
    machine: Machine,
    index: int,
    reason: str,
    *,
    kind: rules.FaultKind,
) -> Effects:
    """A GPU fault (an XID, ECC errors, a row remapping): the GPU is out of placement, its
    worker fails. ``kind`` is what the agent reported; ``reason`` its words, shown as they are."""
    gpus = {g.index: g for g in await repository.gpus_of(session, machine.id)}
    gpu = gpus.get(index)
    if gpu is None:
        raise NotFound("GPU_NOT_FOUND", f"{machine.name} has no GPU {index}.")
    repeated = (gpu.health, gpu.health_reason) == ("unhealthy", reason)
    gpu.health, gpu.health_reason = "unhealthy", reason
    if not repeated:  # the same fault said again is not another
        session.add(
            GpuFault(
                machine_id=machine.id,
                gpu_index=index,
                at=clock.now(),
                kind=kind.value,
                reason=reason[:1000],
            )
        )
    holder: Worker | None = next(
        (w for w in await repository.workers_on(session, machine.id) if index in (w.gpu_ids or [])),
        None,
    )
    if holder is None:
        return Effects()
    return await lifecycle.report(
        session,
        clock,
        machine_id=machine.id,
        worker_id=holder.id,
        kind="exited",
        cause=EndCause.GPU_FAULT,
        detail=f"GPU fault on {machine.name}/{index}: {reason}",
    )


async def gpu_healthy(session: AsyncSession, machine: Machine, index: int) -> None:
    for gpu in await repository.gpus_of(session, machine.id):
        if gpu.index == index:
            gpu.health, gpu.health_reason = "ok", ""
