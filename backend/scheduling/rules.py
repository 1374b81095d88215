"""Placement of gangs: all of a run's workers at once or none, in priority order.

Pure: the machines' room, the pending runs and the placed runs come in as plain data; the
placements, the preemptions and a pending reason for every run left waiting come out.

Order: higher priority first, first submitted first within a priority. A run that cannot be
placed for want of room holds its place on the machines it could use (claims.py): a run behind
it takes room only on machines none of the runs waiting ahead of it could ever use, and is
otherwise "Queued behind" the first of them, so a large gang is never starved by small ones,
and a run waiting for a pool with no machine holds up no run of another pool (issue 36). A run
waiting for its namespace quota, or one that can never fit, holds nothing up.

A run in its restart wait keeps its place and its room (issue 36: the seed's "Restarting in
N s" promises the restart): the room it would be placed in now is kept for it, so that a run
of the same or a lower priority behind it cannot take it ("Queued behind" it, where that room
is all it lacks); a run of higher priority, ahead of it, still can. Without room, it claims
its machines as a run waiting for room does. It is placed once its wait is over, and preempts
nothing before. So is the room of the workers that ended already of a gang still winding
down after a failure (Ask.winding_down): it is kept for the restart, which follows the end of
its last worker.

Workspaces never meet: a reason names a run only to that run's own workspace ("Queued behind
a run of another workspace"), and a run preempts only its own workspace's runs, or, where the
cluster's admins allow it, runs of a workspace holding more than its quota there.

The rules are in pieces, each importing only those below it: placement.py (the machines and
runs as placement sees them, the search for room, the victims that make it), pending_reasons.py
(why a worker fits on each machine or not, what is short where), claims.py (which runs compete
for which machines) and, here, the queue: its order, quotas, the reasons a run waits, the
preemptions, and the rendezvous port.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime

from backend.lifecycle.states import Wait
from backend.lifecycle.views import Placement
from backend.scheduling.claims import Ahead, Claims
from backend.scheduling.pending_reasons import short_on
from backend.scheduling.placement import (
    Ask,
    Held,
    Holder,
    MachineRoom,
    Room,
    best_fit,
    choose_victims,
    cores_text,
    gpus_text,
    memory_text,
    workers_that_fit,
)
from backend.words import counted

ANOTHER_WORKSPACE = "a run of another workspace"


@dataclass(frozen=True)
class Quota:
    workspace: str
    cluster: str
    limit: int


@dataclass
class Plan:
    placements: dict[int, list[Placement]] = field(default_factory=dict)
    # run in its restart wait -> the room kept for it (placed nowhere: it is the room no run
    # behind it may take this pass)
    kept: dict[int, list[Placement]] = field(default_factory=dict)
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
            f"Cannot plan workers: {counted(ask.workers, 'worker')} of {gpus_text(ask.gpus)} "
            f"{'is' if ask.workers == 1 else 'are'} more than {quota.workspace}'s quota of "
            f"{gpus_text(quota.limit)} on {quota.cluster}",
            Wait.PLAN,
        )
    present = [m for m in machines if m.state in ("ready", "draining")]
    if not present:
        return None
    if ask.image:
        present = [m for m in present if m.runs_containers]
        if not present:
            return NO_CONTAINERS, Wait.CONTAINERS
    where = f"in pool {ask.pool}" if ask.pool else "in the cluster"
    if any(m.could_ever_fit(ask.gpus, ask.cpu, ask.memory) for m in present):
        return _whole_gang_never_fits(ask, present, where)
    largest = max(present, key=lambda m: (m.healthy_gpus, m.cpu_total, m.memory_total))
    return (
        f"Cannot plan workers: no machine {where} has room for one worker of {ask.shape()} "
        f"(the largest, {largest.name}, has {gpus_text(largest.healthy_gpus)}, "
        f"{cores_text(largest.cpu_total)}, {memory_text(largest.memory_total)})",
        Wait.PLAN,
    )


def _whole_gang_never_fits(
    ask: Ask, present: list[MachineRoom], where: str
) -> tuple[str, Wait] | None:
    """A gang more workers than the machines present could hold even with nothing else on them
    (two workers of 8 GPUs and one 8-GPU machine) can never be placed: it is not waiting for
    room, and it claims none (it held the machines it could use for ever)."""
    held = _workers_on_empty(ask, present)
    if held >= ask.workers:
        return None
    machines = "its machines that run containers" if ask.image else "its machines"
    return (
        f"Cannot plan workers: {counted(ask.workers, 'worker')} of {ask.shape()} do not fit "
        f"{where}: with nothing else on them, {machines} have room for {held}",
        Wait.PLAN,
    )


def _workers_on_empty(ask: Ask, present: list[MachineRoom]) -> int:
    """How many of the gang's workers the machines would hold with nothing else on them, up to
    the gang's size: each machine's room taken one worker after another, by the subtractions
    placement makes (Room.take), so a fractional CPU ask fits as many times as it would there.
    Machines are independent and the workers alike, so the count is the machines' sum: what
    placing them one by one on empty copies of the machines finds, without the copies."""
    held = 0
    for m in present:
        if not m.takes(ask):
            continue
        gpus, cpu, memory = m.healthy_gpus, m.cpu_total, m.memory_total
        while held < ask.workers and gpus >= ask.gpus and cpu >= ask.cpu and memory >= ask.memory:
            gpus, cpu, memory = gpus - ask.gpus, cpu - ask.cpu, memory - ask.memory
            held += 1
        if held >= ask.workers:
            break
    return held


def _quota_wait(ask: Ask, quota: Quota | None, used: int) -> tuple[str, Wait] | None:
    if quota is None or used + ask.total_gpus <= quota.limit:
        return None
    return (
        f"Waits for namespace quota: {quota.workspace} holds {used} of {gpus_text(quota.limit)} "
        f"on {quota.cluster}; this run asks for {ask.total_gpus}",
        Wait.QUEUE,
    )


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
    room = Room(replace(m, free_gpus=list(m.free_gpus)) for m in machines if m.state == "ready")
    queue = _Queue(room, holders, dict(used_gpus), over_quota, cluster)
    # Whether a shape of gang can ever fit depends only on the machines: decided once per shape.
    never_fits: dict[tuple[object, ...], tuple[str, Wait] | None] = {}
    in_pool: dict[str | None, list[MachineRoom]] = defaultdict(list)
    for m in machines:
        in_pool[m.pool].append(m)
    order = sorted(asks, key=lambda a: (-a.priority, a.queued_at, a.run_id))
    for ask in order:
        quota = quotas.get(ask.workspace_id)
        shape = (ask.pool, ask.workers, ask.gpus, ask.cpu, ask.memory, quota, ask.image)
        if shape not in never_fits:
            pool_machines = machines if ask.pool is None else in_pool[ask.pool]
            never_fits[shape] = _cannot_plan(ask, pool_machines, quota)
        reason = never_fits[shape]
        if reason is None:
            reason = _quota_wait(ask, quota, queue.used.get(ask.workspace_id, 0))
        backing_off = ask.winding_down or (ask.restart_at is not None and ask.restart_at > now)
        if backing_off:
            # Its sentence says when it restarts; until then it keeps its place and its room.
            if reason is None:
                queue.keep(ask, result)
        elif reason is not None:
            result.reasons[ask.run_id], result.waiting[ask.run_id] = reason
        else:
            queue.place(ask, result)
    return result


class _Queue:
    """The pass's room, claims and quota use as the queue is taken in order."""

    def __init__(
        self,
        room: Room,
        holders: list[Holder],
        used: dict[int, int],
        over_quota: dict[int, int],
        cluster: str,
    ) -> None:
        self.room, self.holders, self.used = room, holders, used
        self.over_quota, self.cluster = over_quota, cluster
        self.claims = Claims(room)
        # Room that stopping runs are giving back, promised to the run they stop for.
        self.freeing = [h for h in holders if h.stopping]
        # Room kept for runs in their restart wait, as if they held it, in queue order.
        self.kept: list[Holder] = []

    def _fit(self, ask: Ask) -> tuple[Ahead, list[Placement] | None]:
        """Room for the gang now, on machines no run ahead of it waits for."""
        ahead = self.claims.ahead(ask)
        if ahead.first is not None and not ahead.free:
            return ahead, None  # every machine it could use is claimed ahead of it
        fit = best_fit(self.room, ask, None if ahead.first is None else ahead.free)
        if fit is not None:
            self.used[ask.workspace_id] = self.used.get(ask.workspace_id, 0) + ask.total_gpus
        return ahead, fit

    def place(self, ask: Ask, result: Plan) -> None:
        ahead, fit = self._fit(ask)
        if fit is not None:
            result.placements[ask.run_id] = fit
            return
        self.claims.claim(ask)
        if ahead.first is not None:
            reason = _queued_behind(ask, ahead.first, result)
        else:
            reason = _wait_reason(self, ask, result)
        result.reasons[ask.run_id], result.waiting[ask.run_id] = reason

    def keep(self, ask: Ask, result: Plan) -> None:
        """A run in its restart wait keeps the room it would be placed in now: the runs
        behind it (the same priority or lower) cannot take it. Without room, it claims the
        machines it could use, as a run waiting for room does (and preempts nothing yet)."""
        _, fit = self._fit(ask)
        if fit is None:
            self.claims.claim(ask)
            return
        result.kept[ask.run_id] = fit
        held = tuple(Held(p.machine_id, p.gpu_ids, ask.cpu, ask.memory) for p in fit)
        self.kept.append(
            Holder(ask.run_id, ask.name, ask.priority, ask.workspace_id, held, cost=0.0)
        )


def _queued_behind(ask: Ask, ahead: Ask | Holder, result: Plan) -> tuple[str, Wait]:
    result.blockers[ask.run_id] = ahead.run_id
    name = seen_from(ask.workspace_id, ahead.workspace_id, ahead.name)
    return f"Queued behind {name}", Wait.QUEUE


def _wait_reason(queue: _Queue, ask: Ask, result: Plan) -> tuple[str, Wait]:
    """Why the first run of its machines' queue waits (and what kind of wait that is), and the
    preemptions that make it room."""
    room = queue.room
    waiting_for = [h for h in queue.freeing if h.priority < ask.priority]
    if waiting_for and room.would_fit(ask, waiting_for):
        # Only those the gang needs: the others' room stays for the runs behind it.
        for h in list(waiting_for):
            rest = [w for w in waiting_for if w is not h]
            if rest and room.would_fit(ask, rest):
                waiting_for = rest
        for h in waiting_for:
            queue.freeing.remove(h)
        result.waits[ask.run_id] = [h.run_id for h in waiting_for]
        return f"Next to run: waiting for {_runs_seen_from(ask, waiting_for)} to stop", Wait.QUEUE
    victims = choose_victims(
        room,
        ask,
        [h for h in queue.holders if h.run_id not in result.preemptions],
        queue.over_quota,
    )
    if victims:
        for h in victims:
            result.preemptions[h.run_id] = seen_from(h.workspace_id, ask.workspace_id, ask.name)
            result.preempted_for[h.run_id] = ask.run_id
            if h.workspace_id != ask.workspace_id:
                queue.over_quota[h.workspace_id] -= sum(len(held.gpu_ids) for held in h.held)
        result.waits[ask.run_id] = [h.run_id for h in victims]
        return f"Next to run: waiting for {_runs_seen_from(ask, victims)} to stop", Wait.QUEUE
    keeper = _kept_from(queue, ask)
    if keeper is not None:
        return _queued_behind(ask, keeper, result)
    if not room.has_machines(ask.pool):
        where = f"pool {ask.pool} of {queue.cluster}" if ask.pool else queue.cluster
        return f"No machine fits: {where} has no ready machine", Wait.MACHINES
    count = workers_that_fit(room, ask)
    if count == 0:
        short = short_on(room, ask)
        sentence = f"No machine fits: none has room now for a worker of {ask.shape()}"
        return sentence + (f" ({short})" if short else ""), Wait.MACHINES
    return (
        f"Gang cannot be placed whole: room for {count} of {counted(ask.workers, 'worker')} of "
        f"{ask.shape()}",
        Wait.MACHINES,
    )


def _kept_from(queue: _Queue, ask: Ask) -> Holder | None:
    """Where the room kept for runs ahead in their restart wait is all the gang lacks, the
    first of them on a machine it could use (one check, however many such runs there are)."""
    usable = queue.claims.usable(ask)
    kept = [h for h in queue.kept if any(held.machine_id in usable for held in h.held)]
    if not kept or not queue.room.would_fit(ask, kept):
        return None
    return kept[0]


# Ports rank 0's machine listens on for a gang's rendezvous (MASTER_PORT): one per live run
# there. The server knows only the ports of its own runs; a port another program holds on the
# machine is found by rank 0's agent, which checks it when the START arrives, holds it until
# the worker's process starts, and refuses the start when it is taken (PORT_TAKEN, with a port
# of the kernel's it holds for the gang: issue 37 N3). The gang is placed again at once, no
# restart counted, on that port (scheduling/service.py, offered_port), or where the agent held
# none, on the next free port after the one refused, so it never asks for that one again.
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
