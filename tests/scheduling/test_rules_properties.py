"""Properties of the placement rules over random clusters, queues and placed runs.

Seed L-61, L-62, L-63: every run left pending gets one of the seed's reasons.

The checks use their own arithmetic, not the planner's: every worker of a gang has the same
shape, so the number of workers that fit on a machine is the least of free GPUs, cores and
memory divided by one worker's, and a gang fits iff the sum over the usable machines reaches
its size.
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.scheduling.placement import GIB, Ask, Held, Holder, MachineRoom
from backend.scheduling.rules import NO_CONTAINERS, Plan, Quota, plan

NOW = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)
CLUSTER = "gpu-east"
POOLS = [None, "a100", "h100"]
SEED_PREFIXES = (
    "No machine fits",
    "Gang cannot be placed whole",
    "Queued behind ",
    "Next to run",
    "Waits for namespace quota: ",
    "Cannot plan workers: ",
)
# The reasons of a run that was tried and found no room: it holds its place in the queue.
ROOM_WAITS = ("No machine fits", "Gang cannot be placed whole", "Next to run")
MANY = 10**6

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Scenario:
    machines: list[MachineRoom]
    holders: list[Holder]
    asks: list[Ask]
    quotas: dict[int, Quota]
    used: dict[int, int]

    def plan(self) -> Plan:
        # The planner is handed copies: the checks read the room as it was.
        return plan(
            copy.deepcopy(self.asks),
            copy.deepcopy(self.machines),
            copy.deepcopy(self.holders),
            dict(self.quotas),
            dict(self.used),
            NOW,
            cluster=CLUSTER,
        )


@st.composite
def scenarios(draw: st.DrawFn, roomy: bool | None = None) -> Scenario:
    # Half the clusters are roomy (large machines, mostly free), so that runs get placed and
    # meet their quotas; the others are cramped and varied.
    if roomy is None:
        roomy = draw(st.booleans())
    machines: list[MachineRoom] = []
    # (machine id) -> GPUs, cores and memory not yet given to a holder
    unheld: dict[int, tuple[list[int], float, int]] = {}
    for i in range(draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 6]))):
        gpu_count = 8 if roomy else draw(st.sampled_from([0, 1, 2, 4, 8, 8, 8]))
        unhealthy = draw(st.integers(0, min(gpu_count, 2)))
        healthy = list(range(gpu_count - unhealthy))
        cpu = 64.0 if roomy else draw(st.sampled_from([2.0, 8.0, 16.0, 64.0]))
        memory = (256 if roomy else draw(st.sampled_from([16, 64, 256]))) * GIB
        machines.append(
            MachineRoom(
                id=100 + i,
                name=f"node-{i}",
                pool=draw(st.sampled_from(POOLS)),
                state=draw(st.sampled_from(["ready"] * 5 + ["draining", "lost"])),
                cpu_total=cpu,
                memory_total=memory,
                healthy_gpus=len(healthy),
                free_gpus=[],
                cpu_free=cpu,
                memory_free=memory,
                unhealthy_gpus=unhealthy,
                executor=draw(st.sampled_from([None, "process", "docker", "docker"])),
            )
        )
        unheld[100 + i] = (healthy, cpu, memory)

    # Each healthy GPU is free or held by one of the placed runs; each run holds a little of
    # the cores and memory of the machines it is on.
    count = draw(st.integers(0, 6)) if machines else 0
    held: list[list[Held]] = [[] for _ in range(count)]
    for m in machines:
        gpus, cpu, memory = unheld[m.id]
        free_weight = 3 * count + 3 if roomy else 2
        owners = [draw(st.integers(-free_weight, count - 1)) for _ in gpus]
        for j in sorted(
            {o for o in owners if o >= 0}
            | set(draw(st.sets(st.integers(0, count - 1), max_size=1)) if count else set())
        ):
            take_cpu = min(draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])), cpu)
            take_memory = min(draw(st.sampled_from([0, 8 * GIB])), memory)
            cpu, memory = cpu - take_cpu, memory - take_memory
            ids = tuple(g for g, o in zip(gpus, owners, strict=True) if o == j)
            held[j].append(Held(m.id, ids, take_cpu, take_memory))
        unheld[m.id] = ([g for g, o in zip(gpus, owners, strict=True) if o < 0], cpu, memory)
    holders = [
        Holder(
            run_id=500 + j,
            name=f"held-{j}",
            priority=draw(st.integers(0, 2)),
            workspace_id=draw(st.integers(1, 3)),
            held=tuple(held[j]),
            cost=float(draw(st.integers(0, 1000))),
            stopping=draw(st.sampled_from([False, False, True])),
        )
        for j in range(count)
    ]
    for m in machines:
        gpus, cpu, memory = unheld[m.id]
        m.free_gpus = list(gpus)
        m.cpu_free, m.memory_free = cpu, memory

    asks = []
    for k in range(draw(st.integers(0, 7))):
        workspace_id = draw(st.integers(1, 2))
        asks.append(
            Ask(
                run_id=k + 1,
                name=f"run-{k + 1}",
                workspace_id=workspace_id,
                workspace=f"ws-{workspace_id}",
                priority=draw(st.integers(0, 3)),
                queued_at=NOW - timedelta(minutes=draw(st.integers(0, 4))),
                workers=draw(st.sampled_from([1, 1, 1, 2, 2, 3, 4])),
                gpus=draw(st.sampled_from([0, 1, 1, 2, 2, 3, 4, 8])),
                cpu=draw(st.sampled_from([0.0, 0.5, 1.0, 4.0])),
                memory=draw(st.sampled_from([0, 8, 32])) * GIB,
                pool=draw(st.sampled_from([*POOLS, "a100", "h100"])),
                restart_at=draw(
                    st.sampled_from(
                        [None, None, None, NOW, NOW - timedelta(seconds=5), NOW + timedelta(1)]
                    )
                ),
                image=draw(st.sampled_from([False, False, False, True])),
                winding_down=draw(st.sampled_from([False] * 7 + [True])),
            )
        )
    quotas: dict[int, Quota] = {}
    used: dict[int, int] = {}
    for ws in (1, 2, 3):
        used[ws] = draw(st.integers(0, 8))
        if draw(st.booleans()):
            # Near what it holds, sometimes under it (a quota lowered).
            limit = max(0, used[ws] + draw(st.integers(-2, 16)))
            quotas[ws] = Quota(f"ws-{ws}", CLUSTER, limit)
    return Scenario(machines, holders, asks, quotas, used)


# -- helpers: the checks' own arithmetic ----------------------------------------------------------


def order(asks: list[Ask]) -> list[Ask]:
    return sorted(asks, key=lambda a: (-a.priority, a.queued_at, a.run_id))


def in_restart_wait(a: Ask) -> bool:
    """In its restart wait, or the part of a gang winding down to one that let its room go."""
    return a.winding_down or (a.restart_at is not None and a.restart_at > NOW)


def usable(s: Scenario, a: Ask) -> set[int]:
    """The ready machines that could ever take one worker of the run: its pool, its executor,
    and room enough once empty (issue 36: the runs that compete are those whose sets meet)."""
    return {
        m.id
        for m in s.machines
        if m.state == "ready"
        and a.pool in (None, m.pool)
        and (m.executor == "docker" or not a.image)
        and m.healthy_gpus >= a.gpus
        and m.cpu_total >= a.cpu
        and m.memory_total >= a.memory
    }


def never_fits(s: Scenario, a: Ask) -> bool:
    """Seed L-63 (Cannot plan workers), and a run naming an image where no machine present
    runs containers, by the checks' arithmetic."""
    quota = s.quotas.get(a.workspace_id)
    if quota is not None and a.total_gpus > quota.limit:
        return True
    present = [
        m for m in s.machines if m.state in ("ready", "draining") and a.pool in (None, m.pool)
    ]
    if not present:
        return False
    if a.image:
        present = [m for m in present if m.executor == "docker"]
        if not present:
            return True
    if not any(
        m.healthy_gpus >= a.gpus and m.cpu_total >= a.cpu and m.memory_total >= a.memory
        for m in present
    ):
        return True
    # the whole gang, with nothing else on the machines present (issue 36: two workers of 8
    # GPUs and one 8-GPU machine held it for ever, "Gang cannot be placed whole")
    empty = [Free(set(range(m.healthy_gpus)), m.cpu_total, m.memory_total) for m in present]
    return sum(workers_on(f, a) for f in empty) < a.workers


def claimants(s: Scenario, result: Plan) -> list[Ask]:
    """In queue order, the runs that claim the machines they could use: every run left waiting
    for room (queued behind another or not), and every run in its restart wait without room
    kept for it, that neither its quota nor its shape keeps from being placed."""
    used = dict(s.used)
    out = []
    for a in order(s.asks):
        if a.run_id in result.placements or a.run_id in result.kept:
            used[a.workspace_id] += a.total_gpus
            continue
        quota = s.quotas.get(a.workspace_id)
        over = quota is not None and used[a.workspace_id] + a.total_gpus > quota.limit
        if not over and not never_fits(s, a):
            out.append(a)
    return out


def claimed_before(s: Scenario, result: Plan) -> dict[int, dict[int, Ask]]:
    """For each run, the machines claimed by the runs ahead of it, each by the first of them."""
    claimers = {c.run_id for c in claimants(s, result)}
    claimed: dict[int, Ask] = {}
    out = {}
    for a in order(s.asks):
        out[a.run_id] = dict(claimed)
        if a.run_id in claimers:
            for m in usable(s, a):
                claimed.setdefault(m, a)
    return out


def allowed(s: Scenario, a: Ask, claimed: dict[int, Ask]) -> set[int]:
    """The machines a run may take room on: all it could use, or where a run ahead claimed one
    of them, those nobody ahead claimed."""
    mine = usable(s, a)
    return mine - set(claimed) if mine & set(claimed) else {m.id for m in s.machines}


@dataclass
class Free:
    gpus: set[int]
    cpu: float
    memory: int


def ready_room(s: Scenario) -> dict[int, Free]:
    return {
        m.id: Free(set(m.free_gpus), m.cpu_free, m.memory_free)
        for m in s.machines
        if m.state == "ready"
    }


def workers_on(free: Free, a: Ask) -> int:
    return min(
        len(free.gpus) // a.gpus if a.gpus else MANY,
        int(free.cpu // a.cpu) if a.cpu else MANY,
        free.memory // a.memory if a.memory else MANY,
    )


def takes(m: MachineRoom, a: Ask) -> bool:
    return a.pool in (None, m.pool) and (m.executor == "docker" or not a.image)


def workers_that_fit(s: Scenario, room: dict[int, Free], a: Ask) -> int:
    machines = {m.id: m for m in s.machines}
    return sum(workers_on(f, a) for mid, f in room.items() if takes(machines[mid], a))


def given_back(room: dict[int, Free], holders: list[Holder]) -> dict[int, Free]:
    out = {mid: Free(set(f.gpus), f.cpu, f.memory) for mid, f in room.items()}
    for h in holders:
        for held in h.held:
            if held.machine_id in out:
                f = out[held.machine_id]
                f.gpus |= set(held.gpu_ids)
                f.cpu += held.cpu
                f.memory += held.memory
    return out


def rooms_at_each_turn(s: Scenario, result: Plan) -> dict[int, dict[int, Free]]:
    """The free room of the ready machines when each run's turn came: before it, in order,
    only the runs placed and those whose room was kept took room."""
    by_id = {a.run_id: a for a in s.asks}
    room = ready_room(s)
    out = {}
    for a in order(s.asks):
        out[a.run_id] = given_back(room, [])
        for p in result.placements.get(a.run_id, []) + result.kept.get(a.run_id, []):
            f = room[p.machine_id]
            f.gpus -= set(p.gpu_ids)
            f.cpu -= by_id[a.run_id].cpu
            f.memory -= by_id[a.run_id].memory
    return out


def named_in(reason: str, a: Ask, waited: list[Holder]) -> list[str]:
    """The runs a "Next to run" reason names, checked against the runs the plan says it waits
    for: its own workspace's by name, the others' counted, never named (issue 18)."""
    prefix, suffix = "Next to run: waiting for ", " to stop"
    assert reason.startswith(prefix) and reason.endswith(suffix), reason
    own = [h.name for h in waited if h.workspace_id == a.workspace_id]
    others = len(waited) - len(own)
    shown = list(own)
    if others == 1:
        shown.append("a run of another workspace")
    elif others > 1:
        shown.append(f"{others} runs of other workspaces")
    assert reason == f"{prefix}{', '.join(shown)}{suffix}"
    return own


# -- properties -----------------------------------------------------------------------------------


@SETTINGS
@given(scenarios())
def test_no_gpu_is_given_twice_nor_one_that_was_not_free(s: Scenario) -> None:
    result = s.plan()
    free = {m.id: set(m.free_gpus) for m in s.machines}
    # room kept for a run in its restart wait is given to no other run
    taken = [*result.placements.values(), *result.kept.values()]
    given = Counter((p.machine_id, g) for ps in taken for p in ps for g in p.gpu_ids)
    assert [k for k, n in given.items() if n > 1] == []
    assert [(mid, g) for mid, g in given if g not in free[mid]] == []


@SETTINGS
@given(scenarios())
def test_a_gang_is_placed_whole_or_not_at_all(s: Scenario) -> None:
    result = s.plan()
    by_id = {a.run_id: a for a in s.asks}
    assert set(result.placements) <= set(by_id)
    assert not set(result.placements) & set(result.kept)
    for run_id, ps in [*result.placements.items(), *result.kept.items()]:
        assert len(ps) == by_id[run_id].workers
        assert [len(p.gpu_ids) for p in ps] == [by_id[run_id].gpus] * len(ps)


@SETTINGS
@given(scenarios())
def test_placements_respect_each_machines_room_pool_and_state(s: Scenario) -> None:
    result = s.plan()
    by_id = {a.run_id: a for a in s.asks}
    machines = {m.id: m for m in s.machines}
    cpu: dict[int, float] = defaultdict(float)
    memory: dict[int, int] = defaultdict(int)
    for run_id, ps in [*result.placements.items(), *result.kept.items()]:
        a = by_id[run_id]
        for p in ps:
            m = machines[p.machine_id]
            assert (m.name, m.state) == (p.machine_name, "ready")
            assert takes(m, a)
            cpu[m.id] += a.cpu
            memory[m.id] += a.memory
    for mid in cpu:
        assert cpu[mid] <= machines[mid].cpu_free
        assert memory[mid] <= machines[mid].memory_free


@SETTINGS
@given(scenarios(roomy=True))
def test_quotas_are_never_exceeded(s: Scenario) -> None:
    result = s.plan()
    by_id = {a.run_id: a for a in s.asks}
    placed: dict[int, int] = defaultdict(int)
    for run_id in [*result.placements, *result.kept]:
        placed[by_id[run_id].workspace_id] += by_id[run_id].total_gpus
    for ws, gpus in placed.items():
        if ws in s.quotas:
            assert s.used[ws] + gpus <= s.quotas[ws].limit


@SETTINGS
@given(scenarios())
def test_every_run_left_pending_has_one_of_the_seeds_reasons(s: Scenario) -> None:
    # seed L-61, L-62, L-63
    result = s.plan()
    for a in s.asks:
        if in_restart_wait(a):
            # its sentence says when it restarts (lifecycle's "Restarting in …")
            assert a.run_id not in result.placements
            assert a.run_id not in result.reasons
        elif a.run_id in result.placements:
            assert a.run_id not in result.reasons
        else:
            reason = result.reasons[a.run_id]
            # (and the image run's where no machine runs containers: issue 24)
            assert reason.startswith(SEED_PREFIXES) or reason == NO_CONTAINERS, reason


@SETTINGS
@given(scenarios())
def test_no_backfill_onto_machines_a_run_waiting_ahead_could_use(s: Scenario) -> None:
    """A run left waiting holds its place on every machine it could use: a run after it in
    the queue takes room (placed, or kept in its restart wait) only on machines none of the
    runs waiting ahead of it could use (issue 36: a run that cannot use any of them is never
    held behind them). Runs waiting for quota and runs that can never fit hold nothing up."""
    # seed L-62
    result = s.plan()
    claimed = claimed_before(s, result)
    for a in order(s.asks):
        for p in result.placements.get(a.run_id, []) + result.kept.get(a.run_id, []):
            assert p.machine_id not in claimed[a.run_id], (a.name, claimed[a.run_id][p.machine_id])


@SETTINGS
@given(scenarios())
def test_a_queued_run_names_the_first_run_ahead_it_waits_for(s: Scenario) -> None:
    """ "Queued behind" names the first run ahead that claimed a machine it could use; where
    none did, the first run in its restart wait whose kept room it needs. A run no run ahead
    claims machines from says why from the machines' side."""
    # seed L-62
    result = s.plan()
    queue = order(s.asks)
    position = {a.run_id: i for i, a in enumerate(queue)}
    by_id = {a.run_id: a for a in s.asks}
    claimed = claimed_before(s, result)
    for a in queue:
        reason = result.reasons.get(a.run_id, "")
        if a.run_id in result.placements or in_restart_wait(a) or never_fits(s, a):
            continue
        if reason.startswith("Waits for namespace quota"):
            continue
        mine = usable(s, a)
        firsts = sorted(
            {position[claimed[a.run_id][m].run_id] for m in mine if m in claimed[a.run_id]}
        )
        if firsts:
            blocker = queue[firsts[0]]
        elif reason.startswith("Queued behind "):
            blocker = by_id[result.blockers[a.run_id]]
            kept_on = {p.machine_id for p in result.kept.get(blocker.run_id, [])}
            assert kept_on & mine, (a.name, reason)
            assert position[blocker.run_id] < position[a.run_id]
        else:
            assert reason.startswith(ROOM_WAITS), (a.name, reason)
            continue
        name = blocker.name if blocker.workspace_id == a.workspace_id else None
        assert reason == f"Queued behind {name or 'a run of another workspace'}", a.name
        assert result.blockers[a.run_id] == blocker.run_id


@SETTINGS
@given(scenarios())
def test_a_run_in_its_restart_wait_keeps_room_it_had_at_its_turn(s: Scenario) -> None:
    """Issue 36: a run in its restart wait keeps its place: where the room at its turn, on
    the machines nobody ahead claimed, takes the gang, that room is kept for it (so no run
    behind takes it: test_no_gpu_is_given_twice...); it is never placed before its time."""
    result = s.plan()
    rooms = rooms_at_each_turn(s, result)
    claimed = claimed_before(s, result)
    claimers = {c.run_id for c in claimants(s, result)}
    for a in order(s.asks):
        if not in_restart_wait(a):
            assert a.run_id not in result.kept
            continue
        assert a.run_id not in result.placements
        if a.run_id not in claimers and a.run_id not in result.kept:
            continue  # its quota or its shape: it could not be placed now either
        room = {m: f for m, f in rooms[a.run_id].items() if m in allowed(s, a, claimed[a.run_id])}
        assert (a.run_id in result.kept) == (workers_that_fit(s, room, a) >= a.workers), a.name


@SETTINGS
@given(scenarios())
def test_a_run_waiting_for_room_had_none_and_one_placed_had_room(s: Scenario) -> None:
    # seed L-61: "No machine fits" and "Gang cannot be placed whole" tell the room at its turn
    result = s.plan()
    rooms = rooms_at_each_turn(s, result)
    ready_pools = {m.pool for m in s.machines if m.state == "ready"}
    for a in order(s.asks):
        room = rooms[a.run_id]
        fit = workers_that_fit(s, room, a)
        reason = result.reasons.get(a.run_id, "")
        if a.run_id in result.placements:
            assert fit >= a.workers
        elif reason.startswith("No machine fits: none has room now"):
            assert fit == 0
            assert ready_pools if a.pool is None else ready_pools & {a.pool}
            # What is short on each machine follows in brackets (test_short_resource.py).
            head = f"No machine fits: none has room now for a worker of {a.shape()}"
            assert reason == head or (
                reason.startswith(f"{head} (") and " short on " in reason and reason.endswith(")")
            ), reason
        elif reason.startswith("No machine fits: "):
            assert not (ready_pools if a.pool is None else ready_pools & {a.pool}), reason
            where = f"pool {a.pool} of {CLUSTER}" if a.pool else CLUSTER
            assert reason == f"No machine fits: {where} has no ready machine"
        elif reason.startswith("Gang cannot be placed whole"):
            assert 0 < fit < a.workers
            assert reason == (
                f"Gang cannot be placed whole: room for {fit} of {a.workers} workers of {a.shape()}"
            )


@SETTINGS
@given(scenarios())
def test_each_worker_goes_to_the_tightest_machine_that_fits(s: Scenario) -> None:
    # of the machines it may take room on (no run waiting ahead of it could use them)
    result = s.plan()
    by_id = {a.run_id: a for a in s.asks}
    machines = {m.id: m for m in s.machines}
    rooms = rooms_at_each_turn(s, result)
    claimed = claimed_before(s, result)
    for run_id, ps in [*result.placements.items(), *result.kept.items()]:
        a = by_id[run_id]
        room = rooms[run_id]
        may = allowed(s, a, claimed[run_id])
        for p in ps:
            fitting = [
                len(f.gpus)
                for mid, f in room.items()
                if mid in may and takes(machines[mid], a) and workers_on(f, a) >= 1
            ]
            assert len(room[p.machine_id].gpus) == min(fitting)
            assert p.gpu_ids == tuple(sorted(room[p.machine_id].gpus)[: a.gpus])
            f = room[p.machine_id]
            f.gpus -= set(p.gpu_ids)
            f.cpu -= a.cpu
            f.memory -= a.memory


@SETTINGS
@given(scenarios())
def test_quota_and_cannot_plan_reasons_are_exact(s: Scenario) -> None:
    # seed L-62, L-63
    result = s.plan()
    by_id = {a.run_id: a for a in s.asks}
    used = dict(s.used)
    for a in order(s.asks):
        if a.run_id in result.placements or a.run_id in result.kept:
            used[a.workspace_id] += a.total_gpus
        reason = result.reasons.get(a.run_id, "")
        quota = s.quotas.get(a.workspace_id)
        if reason.startswith("Waits for namespace quota"):
            assert quota is not None
            assert used[a.workspace_id] + a.total_gpus > quota.limit
            assert reason == (
                f"Waits for namespace quota: {quota.workspace} holds {used[a.workspace_id]} of "
                f"{quota.limit} GPU{'' if quota.limit == 1 else 's'} on {CLUSTER}; "
                f"this run asks for {a.total_gpus}"
            )
        elif reason.startswith("Cannot plan workers"):
            assert never_fits(s, a), reason
        elif quota is not None and (a.run_id in result.reasons or a.run_id in result.placements):
            assert a.total_gpus <= quota.limit
    assert set(result.reasons) <= set(by_id)


@SETTINGS
@given(scenarios())
def test_preemption_takes_only_lower_priority_runs_and_only_what_is_needed(s: Scenario) -> None:
    # seed L-62
    result = s.plan()
    holders = {h.run_id: h for h in s.holders}
    asks_by_id = {a.run_id: a for a in s.asks}
    rooms = rooms_at_each_turn(s, result)
    for victim_id, preemptor in result.preemptions.items():
        victim, a = holders[victim_id], asks_by_id[result.preempted_for[victim_id]]
        assert victim.priority < a.priority
        assert not victim.stopping
        assert a.run_id not in result.placements
        assert victim.run_id in result.waits[a.run_id]
        # issue 18: only its own workspace's runs (no policy here), named to them
        assert victim.workspace_id == a.workspace_id
        assert preemptor == a.name
    promised: set[str] = set()
    for a in order(s.asks):
        reason = result.reasons.get(a.run_id, "")
        if not reason.startswith("Next to run"):
            continue
        waited = [holders[i] for i in result.waits[a.run_id]]
        named_in(reason, a, waited)
        victims = [h for h in waited if result.preempted_for.get(h.run_id) == a.run_id]
        room = rooms[a.run_id]
        assert workers_that_fit(s, room, a) < a.workers
        # The runs it waits for make room for it, and each of them is needed.
        assert workers_that_fit(s, given_back(room, waited), a) >= a.workers
        for h in waited:
            rest = [w for w in waited if w is not h]
            assert workers_that_fit(s, given_back(room, rest), a) < a.workers, (a.name, h.name)
        assert all(h.priority < a.priority for h in waited)
        # A stopping run's room goes to one run only.
        stopping = {h.name for h in waited if h.stopping}
        assert not stopping & promised
        promised |= stopping
        if victims:
            # It preempts only when the lower-priority runs already stopping, not promised to
            # a run ahead of it, would not make room.
            free_stopping = [
                h
                for h in s.holders
                if h.stopping and h.priority < a.priority and h.name not in promised
            ]
            assert workers_that_fit(s, given_back(room, free_stopping), a) < a.workers
            assert set(waited) == set(victims)


@SETTINGS
@given(scenarios())
def test_plan_does_not_change_what_it_is_given(s: Scenario) -> None:
    machines = copy.deepcopy(s.machines)
    plan(s.asks, machines, s.holders, s.quotas, s.used, NOW, cluster=CLUSTER)
    assert machines == s.machines


@SETTINGS
@given(scenarios())
def test_with_the_admins_policy_only_workspaces_over_their_quota_lose_runs_to_others(
    s: Scenario,
) -> None:
    # issue 18: another workspace's run is preempted only under the policy, while over quota
    result = plan(
        copy.deepcopy(s.asks),
        copy.deepcopy(s.machines),
        copy.deepcopy(s.holders),
        dict(s.quotas),
        dict(s.used),
        NOW,
        cluster=CLUSTER,
        preempt_over_quota=True,
    )
    holders = {h.run_id: h for h in s.holders}
    taken: dict[int, int] = defaultdict(int)  # GPUs already preempted from each workspace
    for a in order(s.asks):
        victims = [holders[v] for v, by in result.preempted_for.items() if by == a.run_id]
        for victim in victims:
            assert victim.priority < a.priority
            if victim.workspace_id == a.workspace_id:
                assert result.preemptions[victim.run_id] == a.name
                continue
            assert result.preemptions[victim.run_id] == "a run of another workspace"
            # Over its quota when this run's victims were chosen.
            limit = s.quotas[victim.workspace_id].limit
            assert s.used[victim.workspace_id] - taken[victim.workspace_id] > limit
        for victim in victims:
            if victim.workspace_id != a.workspace_id:
                taken[victim.workspace_id] += sum(len(h.gpu_ids) for h in victim.held)
