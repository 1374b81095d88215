"""The scheduling domain's entry point: one placement pass over a cluster."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncSession

from backend.access.rules import Principal
from backend.clock import Clock
from backend.config import get_settings
from backend.lifecycle.gangs import Writes, load_gangs, persist
from backend.lifecycle.sentences import EndCause
from backend.lifecycle.starting import place
from backend.lifecycle.states import Cause
from backend.lifecycle.stops import preempt
from backend.lifecycle.views import Effects
from backend.machines.views import MEMBERS_SEE
from backend.models import Run
from backend.scheduling import repository
from backend.scheduling.pending_reasons import machine_reasons
from backend.scheduling.placement import Ask, Held, Holder, MachineRoom
from backend.scheduling.rules import Plan, Quota, master_port, plan
from backend.spec import Footprint, RunSpec, stored_spec


@dataclass
class PassResult:
    placed: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    # False: its inputs were those of a pass here that changed nothing, so it decided nothing.
    planned: bool = True


def _ask(run: Mapping[Any, Any], workspace: str, needs: Footprint) -> Ask:
    """A pending run's ask, from its row's mapping (by key: a Row's attribute costs 0.6 us, its
    mapping's key a tenth of that, and a pass reads 13 columns of 10 000 runs)."""
    return Ask(
        run_id=run["id"],
        name=run["name"],
        workspace_id=run["workspace_id"],
        workspace=workspace,
        priority=run["priority"],
        queued_at=run["created_at"],
        workers=run["worker_count"],
        gpus=run["gpus_per_worker"],
        cpu=needs.cpu,
        memory=needs.memory,
        pool=needs.pool,
        restart_at=run["restart_at"],
        image=needs.image,
    )


# A gang stopping for these is placed again, under its restart policy, once its last worker has
# ended; meanwhile the room of the workers that ended is kept for it (issue 36: another run took
# it in the seconds its other workers took to wind down).
_RESTARTS_AFTER = (Cause.FAILURE, Cause.STALL)


def _winding_down(placed: list[Row[Any]], names: dict[int, str]) -> list[Ask]:
    """The ask of each gang winding down to restart: the workers it has let go already."""
    by_run: dict[int, list[Row[Any]]] = {}
    for w in placed:
        by_run.setdefault(w.id, []).append(w)
    asks = []
    for workers in by_run.values():
        run = workers[0]._mapping
        let_go = run["worker_count"] - len(workers)
        if run["stop_cause"] in _RESTARTS_AFTER and run["restart_policy"] != "never" and let_go:
            needs = repository.footprint(run)
            ask = _ask({**run, "restart_at": None}, names[run["workspace_id"]], needs)
            asks.append(replace(ask, workers=let_go, winding_down=True))
    return asks


def _rooms(
    machines: list[Row[Any]], gpus: dict[int, list[tuple[int, str]]], placed: list[Row[Any]]
) -> list[MachineRoom]:
    held_gpus: dict[int, set[int]] = defaultdict(set)
    cpu_used: dict[int, float] = defaultdict(float)
    memory_used: dict[int, int] = defaultdict(int)
    for w in placed:
        needs = repository.footprint(w)
        held_gpus[w.machine_id].update(w.gpu_ids or [])
        cpu_used[w.machine_id] += needs.cpu
        memory_used[w.machine_id] += needs.memory
    rooms = []
    for m in machines:
        healthy = [index for index, health in gpus.get(m.id, []) if health == "ok"]
        held = held_gpus[m.id]
        rooms.append(
            MachineRoom(
                id=m.id,
                name=m.name,
                pool=m.pool,
                state=m.state,
                cpu_total=m.cpu_cores,
                memory_total=m.memory_bytes,
                healthy_gpus=len(healthy),
                free_gpus=[i for i in healthy if i not in held],
                cpu_free=m.cpu_cores - cpu_used[m.id],
                memory_free=m.memory_bytes - memory_used[m.id],
                unhealthy_gpus=len(gpus.get(m.id, [])) - len(healthy),
                executor=m.executor,
            )
        )
    return rooms


def _holders(placed: list[Row[Any]], now: datetime) -> tuple[list[Holder], dict[int, int]]:
    by_run: dict[int, list[Row[Any]]] = {}
    for w in placed:
        by_run.setdefault(w.id, []).append(w)
    holders: list[Holder] = []
    used: dict[int, int] = defaultdict(int)
    for workers in by_run.values():
        run = workers[0]
        needs = repository.footprint(run)
        gpus = sum(len(w.gpu_ids or []) for w in workers)
        used[run.workspace_id] += gpus
        since = run.placed_at or now
        holders.append(
            Holder(
                run_id=run.id,
                name=run.name,
                priority=run.priority,
                workspace_id=run.workspace_id,
                held=tuple(
                    Held(w.machine_id, tuple(w.gpu_ids or []), needs.cpu, needs.memory)
                    for w in workers
                ),
                cost=gpus * max((now - since).total_seconds(), 0.0),
                stopping=run.stop_cause is not None,
            )
        )
    return holders, dict(used)


@dataclass
class Inputs:
    asks: list[Ask]
    rooms: list[MachineRoom]
    holders: list[Holder]
    quotas: dict[int, Quota]
    used: dict[int, int]
    cluster: str
    reasons: dict[int, tuple[str, str | None]]  # each pending run's sentence and its Wait
    preempt_over_quota: bool
    # The pending runs' causes (lifecycle EndCause): a preempted run keeps its sentence.
    causes: dict[int, str | None] = field(default_factory=dict)


async def _inputs(session: AsyncSession, cluster_id: int, now: datetime) -> Inputs:
    cluster, preempt_over_quota = await repository.cluster_policy(session, cluster_id)
    machines = await repository.machines(session, cluster_id)
    placed = await repository.placed_workers(session, cluster_id)
    rooms = _rooms(machines, await repository.gpus(session, cluster_id), placed)
    holders, used = _holders(placed, now)
    pending = [r._mapping for r in await repository.pending_runs(session, cluster_id)]
    workspaces = {r["workspace_id"] for r in pending} | {w.workspace_id for w in placed}
    names = await repository.workspace_names(session, list(workspaces))
    quotas = {
        ws_id: Quota(workspace=name, cluster=cluster, limit=limit)
        for ws_id, name, limit in await repository.quotas(session, cluster_id)
    }
    asks = [_ask(r, names[r["workspace_id"]], repository.footprint(r)) for r in pending]
    asks += _winding_down(placed, names)
    return Inputs(
        asks,
        rooms,
        holders,
        quotas,
        used,
        cluster,
        {r["id"]: (r["reason"], r["waits_for"]) for r in pending},
        preempt_over_quota,
        {r["id"]: r["cause"] for r in pending},
    )


@dataclass(frozen=True)
class _Planned:
    """A cluster's last pass in this process that changed nothing: the digest of its inputs,
    the reasons it gave, and when it ran."""

    fingerprint: str
    reasons: dict[str, str]
    at: datetime


# By database and cluster. A pass whose inputs are those of a pass here that changed nothing
# decides nothing new (placement's rules are pure: the same inputs give the same plan, and
# whether a restart's backoff has ended is among the inputs), so it reads the digest and stops.
# A pass is remembered only where the digest after it is the one before it: it wrote nothing,
# and nothing else was committed while it read (a run submitted during a pass is in neither its
# reads nor its plan, but it is in the digest after it). Another process's changes change the
# digest; and a remembered pass is planned again after REPLAN_AFTER whatever the digest says.
_planned: dict[tuple[str, int], _Planned] = {}
REPLAN_AFTER = timedelta(minutes=1)


async def schedule(session: AsyncSession, clock: Clock, cluster_id: int) -> PassResult:
    """Place what fits, preempt what must give way, and say why the rest waits."""
    await repository.lock_cluster(session, cluster_id)
    now = clock.now()
    key = (str(session.get_bind().engine.url), cluster_id)
    before = await repository.inputs_fingerprint(session, cluster_id, now)
    last = _planned.get(key)
    if (
        before is not None
        and last is not None
        and last.fingerprint == before
        and timedelta(0) <= now - last.at < REPLAN_AFTER
    ):
        return PassResult(reasons=dict(last.reasons), planned=False)
    result, wrote = await _plan_and_write(session, cluster_id, now)
    await session.flush()  # every change it made written: the next cluster's pass reads them
    # What a pass writes is among its inputs (a run placed or preempted, a reason changed): after
    # one that wrote, the digest differs from the one before it, and is not read again.
    after = None if wrote else await repository.inputs_fingerprint(session, cluster_id, now)
    if after is not None and after == before:
        _planned[key] = _Planned(after, dict(result.reasons), now)
    else:
        _planned.pop(key, None)
    return result


async def _plan_and_write(
    session: AsyncSession, cluster_id: int, now: datetime
) -> tuple[PassResult, bool]:
    """The pass's decisions, written; and whether it wrote anything."""
    given = await _inputs(session, cluster_id, now)
    decided = plan(
        given.asks,
        given.rooms,
        given.holders,
        given.quotas,
        given.used,
        now,
        cluster=given.cluster,
        preempt_over_quota=given.preempt_over_quota,
    )
    result = PassResult()
    await _preempt(session, decided, now, result)
    await _place(session, decided, now, result)
    names = {a.run_id: a.name for a in given.asks}
    changes = []
    for run_id, reason in decided.reasons.items():
        # A preempted run's reason says so until it runs again (issue 20; seed L-57); another
        # sentence of the scheduler's replaces a restart's, and its cause with it.
        kept = given.causes.get(run_id) == EndCause.PREEMPTED
        wait = decided.waiting[run_id]
        if given.reasons.get(run_id) != (reason, wait) and not kept:
            changes.append({"id": run_id, "reason": reason, "waits_for": str(wait)})
        result.reasons[names[run_id]] = reason
    await repository.set_reasons(session, changes)
    return result, bool(result.placed or result.preempted or changes)


async def _preempt(session: AsyncSession, decided: Plan, now: datetime, result: PassResult) -> None:
    writes = Writes()
    for gang in await load_gangs(session, sorted(decided.preemptions)):
        fx = Effects()
        at = gang.not_before_its_history(now)
        preempt(gang.view, decided.preemptions[gang.run.id], at, fx)
        await persist(session, gang, fx, at, writes)
        result.preempted.append(gang.run.name)
    await writes.flush(session)


async def _place(session: AsyncSession, decided: Plan, now: datetime, result: PassResult) -> None:
    if not decided.placements:
        return
    gangs = await load_gangs(session, sorted(decided.placements))
    in_use = await repository.master_ports_in_use(session)
    heads = [decided.placements[gang.run.id][0].machine_id for gang in gangs]
    placed = {p.machine_id for gang in gangs for p in decided.placements[gang.run.id]}
    addresses = await repository.machine_addresses(session, sorted(placed | set(in_use)))

    def host(machine_id: int) -> str:
        # Machines that advertise one address are one host (several agents on a machine, as
        # in tests): their gangs' ports must differ too.
        return addresses.get(machine_id) or f"#{machine_id}"

    taken_ports: dict[str, set[int]] = defaultdict(set)
    for machine_id, used in in_use.items():
        taken_ports[host(machine_id)] |= used
    first, last = get_settings().master_ports
    ports = range(first, last + 1)
    writes = Writes()
    for gang, head_id in zip(gangs, heads, strict=True):
        placements = decided.placements[gang.run.id]
        head = taken_ports[host(head_id)]
        port = offered_port(gang.run, head, ports) or master_port(head, gang.run.master_port, ports)
        head.add(port)
        fx = Effects()
        at = gang.not_before_its_history(now)
        place(
            gang.view,
            placements,
            at,
            fx,
            master_port=port,
            start_payload=start_payload(gang.spec, gang.run.workspace_id),
            master_addr=addresses.get(head_id),
            gang_addresses=_gang_addresses(placements, addresses),
        )
        await persist(session, gang, fx, at, writes)
        result.placed.append(gang.run.name)
    await writes.flush(session)


def _gang_addresses(placements: Any, addresses: Mapping[int, str]) -> list[str]:
    """Where the gang's machines are, each once in rank order; none when one of them said no
    address (its rank 0's agent then lets any machine reach its MASTER_PORT)."""
    found = [addresses.get(p.machine_id) for p in placements]
    if not all(found):
        return []
    return list(dict.fromkeys(a for a in found if a))


def offered_port(run: Any, taken: set[int], ports: range) -> int | None:
    """The port rank 0's agent held for the gang when its MASTER_PORT was another program's
    (issue 37 N3: the run's port since, outside the range); None when it offered none."""
    port = run.master_port
    if run.cause != EndCause.PORT_TAKEN or port is None or port in ports or port in taken:
        return None
    return int(port)


def start_payload(spec: RunSpec, workspace_id: int) -> dict[str, Any]:
    """What an agent needs to start a worker of a run of this specification."""
    return {
        "image": spec.image,
        "command": spec.command,
        "user": spec.user,
        "environment": dict(spec.environment),
        "mounts": [m.model_dump(mode="json") for m in spec.mounts],
        # Names and targets only: the values reach the machine over its stream when asked.
        "credentials": [c.model_dump(mode="json") for c in spec.credentials],
        "workspace_id": workspace_id,
        "cpu": spec.cpu,
        "memory_limit_bytes": spec.memory_limit_bytes,
        # its digest: the machine fetches the archive while the worker prepares (issue 41)
        "code": spec.code,
    }


async def schedule_all(session: AsyncSession, clock: Clock) -> dict[int, PassResult]:
    return {
        cluster_id: await schedule(session, clock, cluster_id)
        for cluster_id in await repository.cluster_ids(session)
    }


async def pending_reasons(
    session: AsyncSession, clock: Clock, principal: Principal, run: Run
) -> list[tuple[str, str]]:
    """Read a pending reason: why each machine of its cluster does or does not take a worker.

    A workspace's members see the machines its runs may be placed on now or later (ready or
    draining); lost and removed machines are their organisation's admins' alone."""
    given = await _inputs(session, run.cluster_id, clock.now())
    ask = next((a for a in given.asks if a.run_id == run.id and not a.winding_down), None)
    if ask is None:
        names = await repository.workspace_names(session, [run.workspace_id])
        columns = ("id", "name", "workspace_id", "priority", "created_at", "worker_count")
        values = {c: getattr(run, c) for c in (*columns, "gpus_per_worker", "restart_at")}
        ask = _ask(values, names.get(run.workspace_id, ""), stored_spec(run.spec).footprint)
    rooms = given.rooms
    if not principal.is_org_admin:
        rooms = [m for m in rooms if m.state in MEMBERS_SEE]
    return machine_reasons(ask, rooms)
