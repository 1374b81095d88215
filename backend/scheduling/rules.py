"""Placement of gangs: all of a run's workers at once or none, in priority order.

Pure: the machines' room, the pending runs and the placed runs come in as plain data; the
placements, the preemptions and a pending reason for every run left waiting come out.

Order: higher priority first, first submitted first within a priority. A run that cannot be
placed for want of room holds its place: the runs behind it that would use the same machines
are "Queued behind" it (no backfill), so a large gang is never starved by small ones. A run
waiting for its namespace quota, one that can never fit, or one in its restart wait holds
nothing up.

Workspaces never meet: a reason names a run only to that run's own workspace ("Queued behind
a run of another workspace"), and a run preempts only its own workspace's runs, or, where the
cluster's admins allow it, runs of a workspace holding more than its quota there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

from backend.lifecycle.views import Placement
from backend.runs.rules import Wait

# The job that places waiting runs (backend/jobs/actors.py): a service that frees GPUs or
# queues a run asks for it after its commit (backend.db.after_commit).
PASS_JOB = "scheduling.pass"

GIB = 2**30
MIB = 2**20
ANOTHER_WORKSPACE = "a run of another workspace"


def _gib(value: int, way: Callable[[float], int] = round) -> str:
    """Memory as a person writes it: 23.5 GiB, 512 MiB below a GiB (issue 21: not 23.5406 GiB).
    ``way`` rounds: what is free is rounded down and what is needed up, so a shortfall never
    reads as enough."""
    if value < GIB:
        return f"{way(value / MIB)} MiB"
    tenths = way(value * 10 / GIB)
    return f"{tenths // 10} GiB" if tenths % 10 == 0 else f"{tenths / 10:.1f} GiB"


def _cores(value: float) -> str:
    return f"{value:g} core" + ("" if value == 1 else "s")


def _gpus(value: int) -> str:
    return f"{value} GPU" + ("" if value == 1 else "s")


@dataclass
class MachineRoom:
    """A machine as placement sees it: what it has, what is free now."""

    id: int
    name: str
    pool: str | None
    state: str  # ready | draining | lost | removed
    cpu_total: float
    memory_total: int
    healthy_gpus: int
    free_gpus: list[int]
    cpu_free: float
    memory_free: int
    unhealthy_gpus: int = 0
    # How its agent runs workers (Hello.executor): "docker" runs containers; "process" (and an
    # agent that never said, None) runs host processes and so takes no run that names an image.
    executor: str | None = None

    @property
    def runs_containers(self) -> bool:
        return self.executor == "docker"

    def takes(self, ask: Ask) -> bool:
        """Whether its executor can run the ask's workers at all."""
        return self.runs_containers or not ask.image

    def fits(self, gpus: int, cpu: float, memory: int) -> bool:
        return len(self.free_gpus) >= gpus and self.cpu_free >= cpu and self.memory_free >= memory

    def could_ever_fit(self, gpus: int, cpu: float, memory: int) -> bool:
        return self.healthy_gpus >= gpus and self.cpu_total >= cpu and self.memory_total >= memory


@dataclass(frozen=True)
class Ask:
    """A pending run: its gang's shape and its place in the queue."""

    run_id: int
    name: str
    workspace_id: int
    workspace: str
    priority: int
    queued_at: datetime
    workers: int
    gpus: int
    cpu: float
    memory: int
    pool: str | None = None
    restart_at: datetime | None = None
    # The run names an image: only a machine whose agent runs containers takes its workers.
    image: bool = False

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus

    def shape(self) -> str:
        parts = [_gpus(self.gpus), _cores(self.cpu)]
        if self.memory:
            parts.append(_gib(self.memory, math.ceil))
        return ", ".join(parts)


@dataclass(frozen=True)
class Held:
    """What one worker of a placed run holds on its machine."""

    machine_id: int
    gpu_ids: tuple[int, ...]
    cpu: float
    memory: int


@dataclass(frozen=True)
class Holder:
    """A placed run: what it holds, and what stopping it would cost (GPU-seconds so far)."""

    run_id: int
    name: str
    priority: int
    workspace_id: int
    held: tuple[Held, ...]
    cost: float
    stopping: bool = False


@dataclass(frozen=True)
class Quota:
    workspace: str
    cluster: str
    limit: int


@dataclass
class Plan:
    placements: dict[int, list[Placement]] = field(default_factory=dict)
    # victim run id -> the run it makes room for, as the victim's workspace may read it
    preemptions: dict[int, str] = field(default_factory=dict)
    # run id -> the sentence that says why it is still pending (absent: keep its own), and
    # what kind of wait it says (stored beside it: the run's advice is chosen by it)
    reasons: dict[int, str] = field(default_factory=dict)
    waiting: dict[int, Wait] = field(default_factory=dict)
    # What the sentences say, as ids: run -> the run it is queued behind; run -> the runs it
    # waits for to stop; victim -> the run it makes room for.
    blockers: dict[int, int] = field(default_factory=dict)
    waits: dict[int, list[int]] = field(default_factory=dict)
    preempted_for: dict[int, int] = field(default_factory=dict)


def seen_from(workspace_id: int, other_workspace_id: int, name: str) -> str:
    """A run's name as a reason of a run of ``workspace_id`` may show it."""
    return name if workspace_id == other_workspace_id else ANOTHER_WORKSPACE


def _runs_seen_from(ask: Ask, holders: list[Holder]) -> str:
    """The runs a reason of the ask names: its own workspace's by name, the others counted."""
    own = [h.name for h in holders if h.workspace_id == ask.workspace_id]
    others = len(holders) - len(own)
    if others == 1:
        own.append(ANOTHER_WORKSPACE)
    elif others > 1:
        own.append(f"{others} runs of other workspaces")
    return ", ".join(own)


class _Room:
    """The free room of the usable machines, with tentative changes that can be undone.

    Machines are kept in buckets by their free GPU count, so the tightest fit for a worker is
    found by looking at a few buckets rather than at every machine. Within a bucket the order
    is stable: machines by name at first, a machine whose free count changed at the end.
    """

    def __init__(self, machines: Iterable[MachineRoom]) -> None:
        self.machines = {m.id: m for m in sorted(machines, key=lambda m: m.name)}
        self.free_in_pool: dict[str | None, int] = defaultdict(int)
        self.free_total = 0
        self.pools = {m.pool for m in self.machines.values()}
        self.buckets: dict[int, dict[int, MachineRoom]] = defaultdict(dict)
        for m in self.machines.values():
            self.buckets[len(m.free_gpus)][m.id] = m
            self._count(m, len(m.free_gpus))

    def _count(self, m: MachineRoom, delta: int) -> None:
        self.free_in_pool[m.pool] += delta
        self.free_total += delta

    def _move(self, m: MachineRoom, before: int) -> None:
        if len(m.free_gpus) != before:
            del self.buckets[before][m.id]
            self.buckets[len(m.free_gpus)][m.id] = m

    def free_gpus(self, pool: str | None) -> int:
        return self.free_total if pool is None else self.free_in_pool[pool]

    def has_machines(self, pool: str | None) -> bool:
        return bool(self.machines) if pool is None else pool in self.pools

    def tightest(self, ask: Ask) -> MachineRoom | None:
        """The machine with the fewest free GPUs that still takes one worker of the ask."""
        for free in sorted(k for k in self.buckets if k >= ask.gpus):
            for m in self.buckets[free].values():
                if (
                    (ask.pool is None or m.pool == ask.pool)
                    and m.takes(ask)
                    and m.cpu_free >= ask.cpu
                    and m.memory_free >= ask.memory
                ):
                    return m
        return None

    def take(self, m: MachineRoom, gpus: int, cpu: float, memory: int) -> tuple[int, ...]:
        taken = tuple(sorted(m.free_gpus)[:gpus])
        self.take_ids(m, taken, cpu, memory)
        return taken

    def take_ids(self, m: MachineRoom, gpu_ids: Iterable[int], cpu: float, memory: int) -> None:
        ids = set(gpu_ids)
        before = len(m.free_gpus)
        m.free_gpus = [g for g in m.free_gpus if g not in ids]
        m.cpu_free -= cpu
        m.memory_free -= memory
        self._count(m, len(m.free_gpus) - before)
        self._move(m, before)

    def give(self, m: MachineRoom, gpu_ids: Iterable[int], cpu: float, memory: int) -> None:
        before = len(m.free_gpus)
        m.free_gpus = sorted({*m.free_gpus, *gpu_ids})
        m.cpu_free += cpu
        m.memory_free += memory
        self._count(m, len(m.free_gpus) - before)
        self._move(m, before)

    @contextmanager
    def given_back(self, holders: Iterable[Holder]) -> Iterator[None]:
        """As if these runs had stopped, for the length of the block."""
        returned = [
            (self.machines[held.machine_id], held)
            for h in holders
            for held in h.held
            if held.machine_id in self.machines
        ]
        for m, held in returned:
            self.give(m, held.gpu_ids, held.cpu, held.memory)
        try:
            yield
        finally:
            for m, held in returned:
                self.take_ids(m, held.gpu_ids, held.cpu, held.memory)

    def would_fit(self, ask: Ask, holders: Iterable[Holder]) -> bool:
        """Would the gang fit if these runs gave their room back? Changes nothing."""
        with self.given_back(holders):
            fit = _best_fit(self, ask)
            if fit is not None:
                for p in fit:
                    self.give(self.machines[p.machine_id], p.gpu_ids, ask.cpu, ask.memory)
        return fit is not None


def _place_workers(room: _Room, ask: Ask) -> list[tuple[MachineRoom, tuple[int, ...]]]:
    """Take room for the gang's workers one after another, as far as they fit."""
    taken: list[tuple[MachineRoom, tuple[int, ...]]] = []
    for _ in range(ask.workers):
        m = room.tightest(ask)
        if m is None:
            break
        taken.append((m, room.take(m, ask.gpus, ask.cpu, ask.memory)))
    return taken


def _undo(room: _Room, ask: Ask, taken: list[tuple[MachineRoom, tuple[int, ...]]]) -> None:
    for m, ids in reversed(taken):
        room.give(m, ids, ask.cpu, ask.memory)


def _best_fit(room: _Room, ask: Ask) -> list[Placement] | None:
    """Place each worker where it fits most tightly; undo everything if the gang does not fit."""
    if room.free_gpus(ask.pool) < ask.total_gpus:
        return None
    taken = _place_workers(room, ask)
    if len(taken) < ask.workers:
        _undo(room, ask, taken)
        return None
    return [Placement(m.id, m.name, ids) for m, ids in taken]


def _workers_that_fit(room: _Room, ask: Ask) -> int:
    """How many of the gang's workers would fit now, one after another."""
    taken = _place_workers(room, ask)
    _undo(room, ask, taken)
    return len(taken)


# A run naming an image where no machine of its cluster (or pool) runs containers.
NO_CONTAINERS = (
    "No machine runs containers: this cluster's agents run processes; drop image or add a "
    "machine with --executor docker"
)


def _cannot_plan(
    ask: Ask, machines: list[MachineRoom], quota: Quota | None
) -> tuple[str, Wait] | None:
    if quota is not None and ask.total_gpus > quota.limit:
        return (
            f"Cannot plan workers: {ask.workers} workers of {_gpus(ask.gpus)} are more than "
            f"{quota.workspace}'s quota of {_gpus(quota.limit)} on {quota.cluster}",
            Wait.PLAN,
        )
    present = [m for m in machines if m.state in ("ready", "draining")]
    if not present:
        return None
    if ask.image:
        present = [m for m in present if m.runs_containers]
        if not present:
            return NO_CONTAINERS, Wait.CONTAINERS
    if any(m.could_ever_fit(ask.gpus, ask.cpu, ask.memory) for m in present):
        return None
    largest = max(present, key=lambda m: (m.healthy_gpus, m.cpu_total, m.memory_total))
    where = f"in pool {ask.pool}" if ask.pool else "in the cluster"
    return (
        f"Cannot plan workers: no machine {where} has room for one worker of {ask.shape()} "
        f"(the largest, {largest.name}, has {_gpus(largest.healthy_gpus)}, "
        f"{_cores(largest.cpu_total)}, {_gib(largest.memory_total)})",
        Wait.PLAN,
    )


def _quota_wait(ask: Ask, quota: Quota | None, used: int) -> tuple[str, Wait] | None:
    if quota is None or used + ask.total_gpus <= quota.limit:
        return None
    return (
        f"Waits for namespace quota: {quota.workspace} holds {used} of {_gpus(quota.limit)} "
        f"on {quota.cluster}; this run asks for {ask.total_gpus}",
        Wait.QUEUE,
    )


def _choose_victims(
    room: _Room, ask: Ask, holders: list[Holder], over_quota: dict[int, int]
) -> list[Holder] | None:
    """The lower-priority runs whose room, given back, lets the gang fit, at least cost: the
    ask's own workspace's, and those of workspaces still over their quota (``over_quota``: the
    GPUs above it, where the admins' policy allows preempting them)."""
    candidates = sorted(
        (
            h
            for h in holders
            if h.priority < ask.priority
            and not h.stopping
            and (h.workspace_id == ask.workspace_id or over_quota.get(h.workspace_id, 0) > 0)
            and any(held.machine_id in room.machines for held in h.held)
        ),
        key=lambda h: (h.priority, h.cost, h.run_id),
    )
    chosen: list[Holder] = []
    for h in candidates:
        chosen.append(h)
        if room.would_fit(ask, chosen):
            break
    else:
        return None
    # Keep only the victims the gang needs, sparing the most expensive first.
    for h in sorted(chosen, key=lambda h: -h.cost):
        rest = [v for v in chosen if v is not h]
        if rest and room.would_fit(ask, rest):
            chosen = rest
    return chosen


def plan(
    asks: list[Ask],
    machines: list[MachineRoom],
    holders: list[Holder],
    quotas: dict[int, Quota],
    used_gpus: dict[int, int],
    now: datetime,
    *,
    cluster: str,
    preempt_over_quota: bool = False,
) -> Plan:
    """Decide, for one cluster, which pending gangs are placed where and which runs are preempted.

    ``used_gpus`` is each workspace's GPUs held on the cluster now; ``quotas`` its limits.
    ``preempt_over_quota``: the cluster's admins let a run preempt runs of other workspaces
    holding more than their quota, until they are back within it.
    """
    result = Plan()
    over_quota = (
        {
            ws: used_gpus.get(ws, 0) - q.limit
            for ws, q in quotas.items()
            if used_gpus.get(ws, 0) > q.limit
        }
        if preempt_over_quota
        else {}
    )
    # Copies: the machines given are left as they were.
    room = _Room(replace(m, free_gpus=list(m.free_gpus)) for m in machines if m.state == "ready")
    used = dict(used_gpus)
    # Room that stopping runs are giving back, promised to the run they stop for.
    freeing = [h for h in holders if h.stopping]
    blocked: dict[str | None, Ask] = {}
    # Whether a shape of gang can ever fit depends only on the machines: decided once per shape.
    never_fits: dict[tuple[object, ...], tuple[str, Wait] | None] = {}
    order = sorted(asks, key=lambda a: (-a.priority, a.queued_at, a.run_id))
    for ask in order:
        if ask.restart_at is not None and ask.restart_at > now:
            continue
        quota = quotas.get(ask.workspace_id)
        shape = (ask.pool, ask.workers, ask.gpus, ask.cpu, ask.memory, quota, ask.image)
        if shape not in never_fits:
            pool_machines = [m for m in machines if ask.pool is None or m.pool == ask.pool]
            never_fits[shape] = _cannot_plan(ask, pool_machines, quota)
        reason = never_fits[shape]
        if reason is None:
            reason = _quota_wait(ask, quota, used.get(ask.workspace_id, 0))
        if reason is not None:
            result.reasons[ask.run_id], result.waiting[ask.run_id] = reason
            continue
        blocker = _blocker(blocked, ask.pool)
        if blocker is not None:
            result.blockers[ask.run_id] = blocker.run_id
            name = seen_from(ask.workspace_id, blocker.workspace_id, blocker.name)
            result.reasons[ask.run_id] = f"Queued behind {name}"
            result.waiting[ask.run_id] = Wait.QUEUE
            continue
        fit = _best_fit(room, ask)
        if fit is not None:
            result.placements[ask.run_id] = fit
            used[ask.workspace_id] = used.get(ask.workspace_id, 0) + ask.total_gpus
            continue
        blocked[ask.pool] = ask
        result.reasons[ask.run_id], result.waiting[ask.run_id] = _wait_reason(
            room, ask, holders, freeing, result, cluster, over_quota
        )
    return result


def _blocker(blocked: dict[str | None, Ask], pool: str | None) -> Ask | None:
    """The run ahead that holds up this one: one blocked on the same machines."""
    if pool is None:
        return next(iter(blocked.values()), None)
    return blocked.get(pool) or blocked.get(None)


def _wait_reason(
    room: _Room,
    ask: Ask,
    holders: list[Holder],
    freeing: list[Holder],
    result: Plan,
    cluster: str,
    over_quota: dict[int, int],
) -> tuple[str, Wait]:
    """Why the run at the head of its queue waits (and what kind of wait that is), and the
    preemptions that make it room."""
    waiting_for = [h for h in freeing if h.priority < ask.priority]
    if waiting_for and room.would_fit(ask, waiting_for):
        # Only those the gang needs: the others' room stays for the runs behind it.
        for h in list(waiting_for):
            rest = [w for w in waiting_for if w is not h]
            if rest and room.would_fit(ask, rest):
                waiting_for = rest
        for h in waiting_for:
            freeing.remove(h)
        result.waits[ask.run_id] = [h.run_id for h in waiting_for]
        return f"Next to run: waiting for {_runs_seen_from(ask, waiting_for)} to stop", Wait.QUEUE
    victims = _choose_victims(
        room, ask, [h for h in holders if h.run_id not in result.preemptions], over_quota
    )
    if victims:
        for h in victims:
            result.preemptions[h.run_id] = seen_from(h.workspace_id, ask.workspace_id, ask.name)
            result.preempted_for[h.run_id] = ask.run_id
            if h.workspace_id != ask.workspace_id:
                over_quota[h.workspace_id] -= sum(len(held.gpu_ids) for held in h.held)
        result.waits[ask.run_id] = [h.run_id for h in victims]
        return f"Next to run: waiting for {_runs_seen_from(ask, victims)} to stop", Wait.QUEUE
    if not room.has_machines(ask.pool):
        where = f"pool {ask.pool} of {cluster}" if ask.pool else cluster
        return f"No machine fits: {where} has no ready machine", Wait.MACHINES
    count = _workers_that_fit(room, ask)
    if count == 0:
        short = _short_on(room, ask)
        sentence = f"No machine fits: none has room now for a worker of {ask.shape()}"
        return sentence + (f" ({short})" if short else ""), Wait.MACHINES
    return (
        f"Gang cannot be placed whole: room for {count} of {ask.workers} workers of {ask.shape()}",
        Wait.MACHINES,
    )


# How many machines a "No machine fits" reason names for one resource; the others are counted.
SHORT_NAMED = 3


def _short_on(room: _Room, ask: Ask) -> str:
    """What is short, machine by machine, where none takes a worker now: "cores short on a, b;
    GPUs and memory short on c" (the machines of the ask's pool whose agent takes its workers;
    the full numbers: Read a pending reason)."""
    by_short: dict[str, list[str]] = defaultdict(list)
    for m in room.machines.values():
        if (ask.pool is not None and m.pool != ask.pool) or not m.takes(ask):
            continue
        short = [
            what
            for what, lacking in (
                ("GPUs", len(m.free_gpus) < ask.gpus),
                ("cores", m.cpu_free < ask.cpu),
                ("memory", m.memory_free < ask.memory),
            )
            if lacking
        ]
        if short:
            by_short[" and ".join(short)].append(m.name)
    parts = []
    for what, names in by_short.items():
        named = ", ".join(names[:SHORT_NAMED])
        if len(names) > SHORT_NAMED:
            named += f" and {len(names) - SHORT_NAMED} more"
        parts.append(f"{what} short on {named}")
    return "; ".join(parts)


def machine_reasons(ask: Ask, machines: list[MachineRoom]) -> list[tuple[str, str]]:
    """Read a pending reason: for each machine of the cluster, why a worker fits there or not."""
    out = []
    for m in sorted(machines, key=lambda m: m.name):
        out.append((m.name, _machine_reason(ask, m)))
    return out


def _machine_reason(ask: Ask, m: MachineRoom) -> str:
    if m.state == "lost":
        return "lost: its lease expired"
    if m.state == "draining":
        return "draining: takes no new work"
    if m.state != "ready":
        return f"{m.state}: takes no work"
    if ask.pool is not None and m.pool != ask.pool:
        return f"not in pool {ask.pool}"
    if not m.takes(ask):
        return "runs processes, not containers: the run names an image"
    problems = []
    if len(m.free_gpus) < ask.gpus:
        sick = f" ({m.unhealthy_gpus} unhealthy)" if m.unhealthy_gpus else ""
        problems.append(
            f"{len(m.free_gpus)} of {_gpus(m.healthy_gpus + m.unhealthy_gpus)} free{sick}, "
            f"a worker needs {ask.gpus}"
        )
    if m.cpu_free < ask.cpu:
        problems.append(f"{m.cpu_free:g} of {_cores(m.cpu_total)} free, a worker needs {ask.cpu:g}")
    if m.memory_free < ask.memory:
        problems.append(
            f"{_gib(m.memory_free, math.floor)} of {_gib(m.memory_total)} memory free, "
            f"a worker needs {_gib(ask.memory, math.ceil)}"
        )
    if problems:
        return "; ".join(problems)
    fit = min(
        len(m.free_gpus) // ask.gpus if ask.gpus else ask.workers,
        int(m.cpu_free // ask.cpu) if ask.cpu else ask.workers,
        m.memory_free // ask.memory if ask.memory else ask.workers,
    )
    return f"room for {min(fit, ask.workers)} of its {ask.workers} workers"


# Ports rank 0's machine listens on for a gang's rendezvous (MASTER_PORT): one per live run
# there. The server knows only the ports of its own runs; a port another program holds on the
# machine is found by rank 0's agent, which checks it when the START arrives, holds it until
# the worker's process starts, and refuses the start when it is taken ("MASTER_PORT … is in use
# on …"). The gang is then placed again under its restart policy, and master_port() gives the
# next attempt the next free port after the one refused, so it never asks for that one again.
# The default; a cluster's are ASTRAEUS_MASTER_PORTS (backend/config.py).
MASTER_PORTS = range(29500, 30500)


def master_port(taken: set[int], previous: int | None = None, ports: range = MASTER_PORTS) -> int:
    """The first of ``ports`` no live run uses on the machine, counting from the one after the
    run's previous attempt's port (wrapping around); the first port when all are taken (its
    agent then refuses it, saying so)."""
    first = ports.start
    if previous is not None and previous in ports:
        first = previous + 1 if previous + 1 < ports.stop else ports.start
    span = len(ports)
    for i in range(span):
        port = ports.start + (first - ports.start + i) % span
        if port not in taken:
            return port
    return ports.start
