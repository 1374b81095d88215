"""Where a gang's workers fit: the machines, the pending runs and the placed runs as placement
sees them, and the search over the machines' free room (backend/scheduling/rules.py decides
the order in which gangs are placed; this finds where one fits, if it does).

Pure: plain data in, placements out. A worker goes where it fits most tightly, a gang is placed
whole or not at all, and the runs it may preempt are taken lowest priority and cost first until
their room lets it fit, those it does not need then spared.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from backend.lifecycle.views import Placement

GIB = 2**30
MIB = 2**20


# How a reason writes what a machine has and a worker needs: a gang's shape here, the sentences
# of backend/scheduling/rules.py and pending_reasons.py.
def memory_text(value: int, way: Callable[[float], int] = round) -> str:
    """Memory as a person writes it: 23.5 GiB, 512 MiB below a GiB (issue 21: not 23.5406 GiB).
    ``way`` rounds: what is free is rounded down and what is needed up, so a shortfall never
    reads as enough."""
    if value < GIB:
        return f"{way(value / MIB)} MiB"
    tenths = way(value * 10 / GIB)
    return f"{tenths // 10} GiB" if tenths % 10 == 0 else f"{tenths / 10:.1f} GiB"


def cores_text(value: float) -> str:
    return f"{value:g} core" + ("" if value == 1 else "s")


def gpus_text(value: int) -> str:
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
    # Not pending yet: its gang winds down after a failure and will restart; ``workers`` are
    # those that ended already and let their room go (the others still hold theirs).
    winding_down: bool = False

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus

    def shape(self) -> str:
        parts = [gpus_text(self.gpus), cores_text(self.cpu)]
        if self.memory:
            parts.append(memory_text(self.memory, math.ceil))
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


class Room:
    """The free room of the usable machines, with tentative changes that can be undone.

    Machines are kept in buckets by their free GPU count, so the tightest fit for a worker is
    found by looking at a few buckets rather than at every machine. Within a bucket the order
    is stable: machines by name at first, a machine whose free count changed at the end.
    """

    def __init__(self, machines: Iterable[MachineRoom]) -> None:
        self.machines = {m.id: m for m in sorted(machines, key=lambda m: m.name)}
        self.free_in_pool: dict[str | None, int] = defaultdict(int)
        self.free_total = 0
        self.by_pool: dict[str | None, list[MachineRoom]] = defaultdict(list)
        for m in self.machines.values():
            self.by_pool[m.pool].append(m)
        self.pools = set(self.by_pool)
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

    def in_pool(self, pool: str | None) -> Iterable[MachineRoom]:
        """The machines a run of the pool (None: of any) may use."""
        return self.machines.values() if pool is None else self.by_pool.get(pool, [])

    def tightest(self, ask: Ask, only: frozenset[int] | None = None) -> MachineRoom | None:
        """The machine with the fewest free GPUs that still takes one worker of the ask (of
        ``only``, where given)."""
        for free in sorted(k for k in self.buckets if k >= ask.gpus):
            for m in self.buckets[free].values():
                if (
                    (only is None or m.id in only)
                    and (ask.pool is None or m.pool == ask.pool)
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
            fit = best_fit(self, ask)
            if fit is not None:
                for p in fit:
                    self.give(self.machines[p.machine_id], p.gpu_ids, ask.cpu, ask.memory)
        return fit is not None


def _place_workers(
    room: Room, ask: Ask, only: frozenset[int] | None = None
) -> list[tuple[MachineRoom, tuple[int, ...]]]:
    """Take room for the gang's workers one after another, as far as they fit."""
    taken: list[tuple[MachineRoom, tuple[int, ...]]] = []
    for _ in range(ask.workers):
        m = room.tightest(ask, only)
        if m is None:
            break
        taken.append((m, room.take(m, ask.gpus, ask.cpu, ask.memory)))
    return taken


def _undo(room: Room, ask: Ask, taken: list[tuple[MachineRoom, tuple[int, ...]]]) -> None:
    for m, ids in reversed(taken):
        room.give(m, ids, ask.cpu, ask.memory)


def best_fit(room: Room, ask: Ask, only: frozenset[int] | None = None) -> list[Placement] | None:
    """Place each worker where it fits most tightly (on the machines ``only`` names, where
    given); undo everything if the gang does not fit."""
    if room.free_gpus(ask.pool) < ask.total_gpus or (only is not None and not only):
        return None
    taken = _place_workers(room, ask, only)
    if len(taken) < ask.workers:
        _undo(room, ask, taken)
        return None
    return [Placement(m.id, m.name, ids) for m, ids in taken]


def workers_that_fit(room: Room, ask: Ask) -> int:
    """How many of the gang's workers would fit now, one after another."""
    taken = _place_workers(room, ask)
    _undo(room, ask, taken)
    return len(taken)


def choose_victims(
    room: Room, ask: Ask, holders: list[Holder], over_quota: dict[int, int]
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
