"""Placement rules: gangs whole or not at all, in priority order, with the seed's reasons.

Seed L-61: `No machine fits`, `Gang cannot be placed whole` and the per-machine reasons.
Seed L-62: `Queued behind …`, `Next to run …`, `Waits for namespace quota: …`.
Seed L-63: `Cannot plan workers: …`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from backend.lifecycle.views import Placement
from backend.scheduling.pending_reasons import machine_reasons
from backend.scheduling.placement import GIB, Held, Holder
from backend.scheduling.rules import Quota
from tests.support.scheduling import CLUSTER, NOW, ask, machine, run_plan


def holder(
    run_id: int,
    name: str,
    *,
    priority: int = 0,
    on: Sequence[tuple[int, Sequence[int]]],
    cost: float = 100.0,
    stopping: bool = False,
    cpu: float = 1,
    workspace_id: int = 1,
) -> Holder:
    return Holder(
        run_id=run_id,
        name=name,
        priority=priority,
        workspace_id=workspace_id,
        held=tuple(Held(m, tuple(ids), cpu, 0) for m, ids in on),
        cost=cost,
        stopping=stopping,
    )


# -- placing gangs ------------------------------------------------------------------------------


def test_a_gang_is_placed_whole_each_worker_on_the_tightest_machine() -> None:
    machines = [
        machine(1, "node-a"),  # 8 free
        machine(2, "node-b", free=[4, 5, 6, 7]),  # 4 free
        machine(3, "node-c", free=[3, 6]),  # 2 free: the tightest
    ]
    result = run_plan([ask(10, "llm", workers=2, gpus=2)], machines)
    assert result.placements == {
        10: [Placement(3, "node-c", (3, 6)), Placement(2, "node-b", (4, 5))],
    }
    assert result.reasons == {}
    assert result.preemptions == {}


def test_best_fit_skips_a_tighter_machine_without_cpu_or_memory() -> None:
    machines = [
        machine(1, "node-a"),
        machine(2, "node-b", free=[0, 1], cpu_free=1),  # tight on GPUs, short of cores
        machine(3, "node-c", free=[0, 1, 2], memory_free=8 * GIB),  # short of memory
        machine(4, "node-d", free=[5, 6, 7, 1]),
    ]
    result = run_plan([ask(10, "llm", gpus=2, cpu=4, memory=16 * GIB)], machines)
    assert result.placements == {10: [Placement(4, "node-d", (1, 5))]}


def test_a_run_without_gpus_takes_the_machine_with_the_fewest_free_gpus() -> None:
    machines = [machine(1, "node-a"), machine(2, "cpu-1", gpus=0), machine(3, "node-b")]
    result = run_plan([ask(10, "etl", gpus=0, cpu=8)], machines)
    assert result.placements == {10: [Placement(2, "cpu-1", ())]}


def test_workers_share_a_machine_when_it_has_room_for_them() -> None:
    result = run_plan([ask(10, "llm", workers=3, gpus=2)], [machine(1, "node-a")])
    assert result.placements == {
        10: [
            Placement(1, "node-a", (0, 1)),
            Placement(1, "node-a", (2, 3)),
            Placement(1, "node-a", (4, 5)),
        ]
    }


def test_a_gang_of_two_with_room_for_one_worker_cannot_be_placed_whole() -> None:
    # seed L-61
    machines = [machine(1, "node-a", free=[0, 1, 2, 3]), machine(2, "node-b", free=[0, 1])]
    result = run_plan([ask(10, "llm", workers=2, gpus=4, cpu=8, memory=64 * GIB)], machines)
    assert result.placements == {}
    assert result.reasons == {
        10: "Gang cannot be placed whole: room for 1 of 2 workers of 4 GPUs, 8 cores, 64 GiB"
    }


def test_no_machine_fits_when_none_has_room_now() -> None:
    # seed L-61
    machines = [
        machine(1, "node-a", free=[0, 1]),
        machine(2, "node-b", free=[0, 1, 2, 3], cpu_free=0.5),
    ]
    result = run_plan([ask(10, "llm", gpus=4, cpu=1, memory=16 * GIB)], machines)
    assert result.placements == {}
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 4 GPUs, 1 core, 16 GiB"
        " (GPUs short on node-a; cores short on node-b)"
    }


def test_no_machine_fits_when_the_cluster_has_no_ready_machine() -> None:
    # seed L-61
    machines = [machine(1, "node-a", state="draining"), machine(2, "node-b", state="lost")]
    result = run_plan([ask(10, "llm", gpus=1)], machines)
    assert result.placements == {}
    assert result.reasons == {10: "No machine fits: gpu-east has no ready machine"}


def test_no_machine_fits_when_the_pool_has_no_ready_machine() -> None:
    # seed L-61: the other pool's ready machines do not count
    machines = [
        machine(1, "node-a", pool="a100"),
        machine(2, "node-h", pool="h100", state="draining"),
    ]
    result = run_plan([ask(10, "llm", gpus=1, pool="h100")], machines)
    assert result.placements == {}
    assert result.reasons == {10: "No machine fits: pool h100 of gpu-east has no ready machine"}


def test_a_worker_bigger_than_any_machine_cannot_be_planned() -> None:
    # seed L-63: a lost machine, however large, does not count
    machines = [
        machine(1, "node-a", cpu=32, memory=256 * GIB),
        machine(2, "node-b", cpu=64, memory=512 * GIB),
        machine(3, "node-big", gpus=16, state="lost"),
    ]
    asks = [ask(10, "huge", gpus=16, cpu=4), ask(11, "small", gpus=1, queued=1)]
    result = run_plan(asks, machines)
    assert result.reasons == {
        10: "Cannot plan workers: no machine in the cluster has room for one worker of "
        "16 GPUs, 4 cores (the largest, node-b, has 8 GPUs, 64 cores, 512 GiB)"
    }
    # It holds nothing up.
    assert result.placements == {11: [Placement(1, "node-a", (0,))]}


def test_a_worker_bigger_than_any_machine_of_its_pool_cannot_be_planned() -> None:
    # seed L-63: a draining machine still counts as one the worker could fit on some day
    machines = [
        machine(1, "node-a", pool="a100", gpus=4, cpu=1, memory=8 * GIB),
        machine(2, "node-big", pool="h100", gpus=8),
    ]
    result = run_plan([ask(10, "llm", gpus=8, pool="a100", memory=GIB)], machines)
    assert result.reasons == {
        10: "Cannot plan workers: no machine in pool a100 has room for one worker of "
        "8 GPUs, 1 core, 1 GiB (the largest, node-a, has 4 GPUs, 1 core, 8 GiB)"
    }
    machines[0].state = "draining"
    machines[1].pool = "a100"
    machines[1].state = "draining"
    result = run_plan([ask(10, "llm", gpus=8, pool="a100", memory=GIB)], machines)
    assert result.reasons == {10: "No machine fits: pool a100 of gpu-east has no ready machine"}


def test_a_gang_the_machines_could_never_hold_whole_cannot_be_planned() -> None:
    # seed L-63 (issue 36): two 8-GPU workers and one 8-GPU machine: not "Gang cannot be placed
    # whole", which waits for room and held the machine for the gang for ever
    machines = [
        machine(1, "node-a"),
        machine(2, "node-b", gpus=4, free=[0, 1, 2, 3]),
        machine(3, "node-big", gpus=16, state="lost"),
    ]
    asks = [ask(10, "wide", workers=2, gpus=8, cpu=4), ask(11, "small", gpus=6, queued=1)]
    result = run_plan(asks, machines)
    assert result.reasons == {
        10: "Cannot plan workers: 2 workers of 8 GPUs, 4 cores do not fit in the cluster: with "
        "nothing else on them, its machines have room for 1"
    }
    # It holds nothing up: the run behind it takes the machine it could never have.
    assert result.placements == {11: [Placement(1, "node-a", (0, 1, 2, 3, 4, 5))]}
    # A draining machine counts, as it may come back: then the gang waits for room (and the
    # run behind it for the gang), not for plans.
    machines[2].state = "draining"
    result = run_plan(asks, machines)
    assert result.reasons == {
        10: "Gang cannot be placed whole: room for 1 of 2 workers of 8 GPUs, 4 cores",
        11: "Queued behind wide",
    }


def test_a_gang_larger_than_its_quota_cannot_be_planned() -> None:
    # seed L-63
    quotas = {1: Quota("vision", CLUSTER, 8)}
    result = run_plan([ask(10, "llm", workers=3, gpus=4)], [machine(1, "n", gpus=16)], None, quotas)
    assert result.placements == {}
    assert result.reasons == {
        10: "Cannot plan workers: 3 workers of 4 GPUs are more than vision's quota of 8 GPUs "
        "on gpu-east"
    }


def test_a_run_waits_for_its_namespace_quota() -> None:
    # seed L-62
    quotas = {1: Quota("vision", CLUSTER, 8)}
    result = run_plan([ask(10, "llm", gpus=4)], [machine(1, "node-a")], None, quotas, {1: 6})
    assert result.placements == {}
    assert result.reasons == {
        10: "Waits for namespace quota: vision holds 6 of 8 GPUs on gpu-east; this run asks for 4"
    }


def test_the_quota_counts_the_runs_placed_in_the_same_plan_and_holds_nothing_up() -> None:
    # seed L-62
    quotas = {1: Quota("vision", CLUSTER, 6), 2: Quota("audio", CLUSTER, 2)}
    asks = [
        ask(10, "first", gpus=4),
        ask(11, "second", gpus=4, queued=1),
        ask(12, "other", gpus=2, queued=2, workspace_id=2, workspace="audio"),
        ask(13, "exact", gpus=2, queued=3),
    ]
    result = run_plan(asks, [machine(1, "node-a", gpus=16)], None, quotas, {2: 0})
    assert result.reasons == {
        11: "Waits for namespace quota: vision holds 4 of 6 GPUs on gpu-east; this run asks for 4"
    }
    assert result.placements == {
        10: [Placement(1, "node-a", (0, 1, 2, 3))],
        12: [Placement(1, "node-a", (4, 5))],
        13: [Placement(1, "node-a", (6, 7))],
    }


# -- the queue ----------------------------------------------------------------------------------


def test_higher_priority_first_then_first_submitted_first() -> None:
    # seed L-62
    asks = [
        ask(10, "old-low", gpus=2, priority=0, queued=0),
        ask(11, "new-low", gpus=2, priority=0, queued=5),
        ask(12, "new-high", gpus=2, priority=5, queued=9),
        ask(13, "tied-low", gpus=2, priority=0, queued=0),  # same time as old-low: by run id
    ]
    result = run_plan(asks, [machine(1, "node-a", free=range(6))])
    assert result.placements == {
        12: [Placement(1, "node-a", (0, 1))],
        10: [Placement(1, "node-a", (2, 3))],
        13: [Placement(1, "node-a", (4, 5))],
    }
    assert result.reasons == {
        11: "No machine fits: none has room now for a worker of 2 GPUs, 1 core"
        " (GPUs short on node-a)"
    }


def test_no_backfill_a_small_run_queues_behind_a_blocked_big_run() -> None:
    # seed L-62: the big gang holds its place; the small ones behind it do not jump ahead
    asks = [
        ask(10, "big", gpus=8, priority=1),
        ask(11, "small", gpus=1, priority=1, queued=1),
        ask(12, "smaller-priority", gpus=1, priority=0),
    ]
    result = run_plan(asks, [machine(1, "node-a", free=[0, 1, 2, 3])])
    assert result.placements == {}
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 8 GPUs, 1 core"
        " (GPUs short on node-a)",
        11: "Queued behind big",
        12: "Queued behind big",
    }


def test_a_run_of_another_pool_is_not_held_up_by_a_blocked_run() -> None:
    # seed L-62; issue 36: a run of no pool takes room on the machines the blocked run cannot
    # use, never on those it could
    machines = [
        machine(1, "node-a", pool="a100", free=[0, 1]),
        machine(2, "node-h", pool="h100", free=[0, 1]),
    ]
    asks = [
        ask(10, "big-a", gpus=8, pool="a100"),
        ask(11, "small-h", gpus=1, pool="h100", queued=1),
        ask(12, "small-a", gpus=1, pool="a100", queued=2),
        ask(13, "small-any", gpus=1, queued=3),  # could use the a100 machines too
        ask(14, "pair-any", gpus=1, workers=2, queued=4),  # one worker fits on node-h
    ]
    result = run_plan(asks, machines)
    assert result.placements == {
        11: [Placement(2, "node-h", (0,))],
        13: [Placement(2, "node-h", (1,))],
    }
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 8 GPUs, 1 core"
        " (GPUs short on node-a)",
        12: "Queued behind big-a",
        14: "Queued behind big-a",
    }
    assert result.blockers == {12: 10, 14: 10}


def test_a_blocked_run_of_any_pool_holds_up_every_pool() -> None:
    # seed L-62: it could use the h100 machine too
    machines = [
        machine(1, "node-a", pool="a100", free=[0]),
        machine(2, "node-h", pool="h100", free=[0, 1, 2, 3]),
    ]
    asks = [ask(10, "big-any", gpus=8), ask(11, "small-h", gpus=1, pool="h100", queued=1)]
    result = run_plan(asks, machines)
    assert result.placements == {}
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 8 GPUs, 1 core"
        " (GPUs short on node-a, node-h)",
        11: "Queued behind big-any",
    }


def test_a_run_pinned_to_a_pool_without_machines_holds_nobody_up() -> None:
    # issue 36: it stayed at the head, and every later run of no pool was "Queued behind" it
    # though machines were free
    machines = [
        machine(1, "node-a", pool="a100", free=[0, 1]),
        machine(2, "node-far", pool="far", state="lost"),
    ]
    asks = [
        ask(10, "pinned", gpus=1, pool="far", priority=5),
        ask(11, "any", gpus=1, queued=1),
        ask(12, "a100", gpus=1, pool="a100", queued=2),
    ]
    result = run_plan(asks, machines)
    assert result.placements == {
        11: [Placement(1, "node-a", (0,))],
        12: [Placement(1, "node-a", (1,))],
    }
    assert result.reasons == {10: "No machine fits: pool far of gpu-east has no ready machine"}


def test_a_run_no_ready_machine_could_take_holds_nobody_up() -> None:
    # issue 36: the only machine with 16 GPUs is draining; the big run waits for it alone
    machines = [machine(1, "node-a"), machine(2, "node-big", gpus=16, state="draining")]
    asks = [ask(10, "huge", gpus=16, priority=5), ask(11, "small", gpus=1, queued=1)]
    result = run_plan(asks, machines)
    assert result.placements == {11: [Placement(1, "node-a", (0,))]}
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 16 GPUs, 1 core"
        " (GPUs short on node-a)"
    }


def test_runs_behind_compete_with_the_runs_queued_ahead_of_them_too() -> None:
    # issue 36: "wide" waits behind "big-a" and could use node-h: "small-h" behind it waits
    # too, so that the runs ahead of it are never delayed by it
    machines = [
        machine(1, "node-a", pool="a100", free=[0, 1]),
        machine(2, "node-h", pool="h100", free=[0]),
    ]
    asks = [
        ask(10, "big-a", gpus=8, pool="a100"),
        ask(11, "wide", gpus=2, queued=1),
        ask(12, "small-h", gpus=1, pool="h100", queued=2),
    ]
    result = run_plan(asks, machines)
    assert result.placements == {}
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 8 GPUs, 1 core"
        " (GPUs short on node-a)",
        11: "Queued behind big-a",
        12: "Queued behind wide",
    }


def test_a_run_needing_containers_does_not_wait_behind_one_needing_processes() -> None:
    # issue 36: the machines each could use do not meet
    processes = machine(1, "node-p", free=[0])
    docker = replace(machine(2, "node-d", free=[0, 1]), executor="docker")
    asks = [
        ask(10, "big", gpus=4),
        replace(ask(11, "image", gpus=1, queued=1), image=True),
    ]
    result = run_plan(asks, [processes, docker])
    # "big" could use node-d too: the image run waits behind it
    assert result.reasons[11] == "Queued behind big"
    only_processes = [processes, replace(docker, healthy_gpus=2, free_gpus=[0, 1])]
    result = run_plan(asks, only_processes)
    assert result.placements == {11: [Placement(2, "node-d", (0,))]}
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 4 GPUs, 1 core"
        " (GPUs short on node-d, node-p)"
    }


def test_a_run_in_its_restart_wait_keeps_its_place_and_its_room() -> None:
    # issue 36: during the wait a later run took its machines, and it fell behind that run
    asks = [
        ask(10, "restarting", gpus=4, restart_at=NOW + timedelta(seconds=20)),
        ask(11, "same-later", gpus=2, queued=1),
        ask(12, "lower", gpus=2, priority=-1),
        ask(13, "small", gpus=1, queued=2),
    ]
    result = run_plan(asks, [machine(1, "node-a", free=range(5))])
    assert result.kept == {10: [Placement(1, "node-a", (0, 1, 2, 3))]}
    assert result.placements == {}
    # "same-later" lacks only the room kept; the others wait behind it (no backfill)
    assert result.reasons == {
        11: "Queued behind restarting",
        12: "Queued behind same-later",
        13: "Queued behind same-later",
    }
    assert result.blockers == {11: 10, 12: 11, 13: 11}
    # a run that fits beside the room kept is placed
    alone = run_plan([asks[0], asks[3]], [machine(1, "node-a", free=range(5))])
    assert alone.placements == {13: [Placement(1, "node-a", (4,))]}
    # once its wait is over it is placed in that room
    later = run_plan([replace(a, restart_at=NOW) for a in asks[:3]], [machine(1, "node-a")])
    assert later.placements[10] == [Placement(1, "node-a", (0, 1, 2, 3))]


def test_a_run_of_higher_priority_still_takes_the_room_of_a_run_in_its_restart_wait() -> None:
    asks = [
        ask(10, "restarting", gpus=4, priority=1, restart_at=NOW + timedelta(seconds=20)),
        ask(11, "urgent", gpus=4, priority=2, queued=1),
        ask(12, "same", gpus=1, priority=1, queued=2),
    ]
    result = run_plan(asks, [machine(1, "node-a", free=range(6))])
    assert result.placements == {11: [Placement(1, "node-a", (0, 1, 2, 3))]}
    assert result.kept == {}
    # without room kept, it claims its machines as a run waiting for room: nothing passes it
    assert result.reasons == {12: "Queued behind restarting"}


def test_a_run_in_its_restart_wait_without_room_preempts_nothing_yet() -> None:
    holders = [holder(500, "low", priority=0, on=[(1, range(8))])]
    asks = [ask(10, "restarting", gpus=8, priority=5, restart_at=NOW + timedelta(seconds=20))]
    result = run_plan(asks, [machine(1, "node-a", free=[])], holders)
    assert (result.placements, result.kept, result.preemptions, result.reasons) == (
        {},
        {},
        {},
        {},
    )
    over = run_plan([replace(asks[0], restart_at=NOW)], [machine(1, "node-a", free=[])], holders)
    assert over.preemptions == {500: "restarting"}


def test_a_run_in_its_restart_wait_keeps_its_quota_too() -> None:
    quotas = {1: Quota("vision", CLUSTER, 4)}
    asks = [
        ask(10, "restarting", gpus=4, restart_at=NOW + timedelta(seconds=20)),
        ask(11, "later", gpus=1, queued=1),
    ]
    result = run_plan(asks, [machine(1, "node-a")], quotas=quotas)
    assert result.kept == {10: [Placement(1, "node-a", (0, 1, 2, 3))]}
    assert result.reasons == {
        11: "Waits for namespace quota: vision holds 4 of 4 GPUs on gpu-east; this run asks for 1"
    }


def test_a_run_in_its_restart_wait_that_can_never_fit_holds_nothing_up() -> None:
    quotas = {1: Quota("vision", CLUSTER, 2)}
    asks = [
        ask(10, "restarting", gpus=4, restart_at=NOW + timedelta(seconds=20)),
        ask(11, "due", gpus=2, restart_at=NOW, queued=1),
    ]
    result = run_plan(asks, [machine(1, "node-a", free=range(4))], quotas=quotas)
    assert result.placements == {11: [Placement(1, "node-a", (0, 1))]}
    assert (result.kept, result.reasons) == ({}, {})


# -- preemption ---------------------------------------------------------------------------------


def test_a_high_priority_run_preempts_the_cheapest_lower_priority_run_that_makes_room() -> None:
    # seed L-62
    machines = [machine(1, "node-a", free=[]), machine(2, "node-b", free=[])]
    holders = [
        holder(20, "cheap-half", on=[(1, [0, 1, 2, 3])], cost=10),
        holder(21, "dear-half", on=[(1, [4, 5, 6, 7])], cost=300),
        holder(22, "whole", on=[(2, range(8))], cost=100),
        holder(23, "peer", on=[], priority=5, cost=1),
    ]
    result = run_plan([ask(10, "urgent", gpus=8, priority=5)], machines, holders)
    # cheap-half alone is not enough; with whole it is, and then cheap-half is not needed.
    assert result.preemptions == {22: "urgent"}
    assert result.reasons == {10: "Next to run: waiting for whole to stop"}
    assert result.placements == {}


def test_preemption_takes_several_runs_when_the_gang_needs_them() -> None:
    # seed L-62
    machines = [machine(1, "node-a", free=[])]
    holders = [
        holder(20, "dear", on=[(1, [4, 5, 6, 7])], cost=300),
        holder(21, "cheap", on=[(1, [0, 1, 2, 3])], cost=10),
    ]
    result = run_plan([ask(10, "urgent", workers=2, gpus=4, priority=1)], machines, holders)
    assert result.preemptions == {21: "urgent", 20: "urgent"}
    assert result.reasons == {10: "Next to run: waiting for cheap, dear to stop"}


def test_preemption_takes_the_lowest_priority_first() -> None:
    machines = [machine(1, "node-a", free=[])]
    holders = [
        holder(20, "mid-cheap", priority=2, on=[(1, [0, 1, 2, 3])], cost=1),
        holder(21, "low-dear", priority=1, on=[(1, [4, 5, 6, 7])], cost=900),
    ]
    result = run_plan([ask(10, "urgent", gpus=4, priority=3)], machines, holders)
    assert result.preemptions == {21: "urgent"}
    assert result.reasons == {10: "Next to run: waiting for low-dear to stop"}


def test_never_preempts_a_run_of_equal_or_higher_priority() -> None:
    # seed L-61, L-62
    machines = [machine(1, "node-a", free=[])]
    holders = [
        holder(20, "peer", priority=3, on=[(1, [0, 1, 2, 3])], cost=1),
        holder(21, "boss", priority=4, on=[(1, [4, 5, 6, 7])], cost=1),
    ]
    result = run_plan([ask(10, "urgent", gpus=4, priority=3)], machines, holders)
    assert result.preemptions == {}
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 4 GPUs, 1 core"
        " (GPUs short on node-a)"
    }


def test_no_preemption_when_even_all_lower_priority_runs_would_not_make_room() -> None:
    machines = [machine(1, "node-a", free=[])]
    holders = [
        holder(20, "low", priority=0, on=[(1, [0, 1, 2, 3])]),
        holder(21, "peer", priority=3, on=[(1, [4, 5, 6, 7])]),
    ]
    result = run_plan([ask(10, "urgent", gpus=8, priority=3)], machines, holders)
    assert result.preemptions == {}
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 8 GPUs, 1 core"
        " (GPUs short on node-a)"
    }


def test_a_run_waits_for_runs_already_stopping_instead_of_preempting_more() -> None:
    # seed L-62
    machines = [machine(1, "node-a", free=[])]
    holders = [
        holder(20, "running", on=[(1, [0, 1, 2, 3])], cost=1),
        holder(21, "stopping", on=[(1, [4, 5, 6, 7])], cost=500, stopping=True),
    ]
    result = run_plan([ask(10, "urgent", gpus=4, priority=2)], machines, holders)
    assert result.preemptions == {}
    assert result.reasons == {10: "Next to run: waiting for stopping to stop"}


def test_a_stopping_run_is_promised_to_one_waiting_run_and_waited_for_only_where_needed() -> None:
    # seed L-62: each run waits for the stopping run on its own machines; neither preempts
    machines = [
        machine(1, "node-a", pool="a100", free=[]),
        machine(2, "node-h", pool="h100", free=[]),
    ]
    holders = [
        holder(20, "stopping-a", on=[(1, range(8))], stopping=True),
        holder(21, "stopping-h", on=[(2, range(4))], stopping=True),
        holder(22, "running-h", on=[(2, range(4, 8))], cost=1),
    ]
    asks = [
        ask(10, "urgent-a", gpus=8, priority=3, pool="a100"),
        ask(11, "urgent-h", gpus=4, priority=2, pool="h100"),
    ]
    result = run_plan(asks, machines, holders)
    assert result.preemptions == {}
    assert result.reasons == {
        10: "Next to run: waiting for stopping-a to stop",
        11: "Next to run: waiting for stopping-h to stop",
    }


def test_a_stopping_run_promised_to_one_run_does_not_make_room_for_the_next() -> None:
    # seed L-62
    machines = [machine(1, "node-a", free=[])]
    holders = [
        holder(20, "stopping", on=[(1, [0, 1, 2, 3])], stopping=True),
        holder(21, "running", on=[(1, [4, 5, 6, 7])], cost=1),
    ]
    asks = [
        ask(10, "first", gpus=4, priority=3, pool=None),
        ask(11, "second", gpus=4, priority=2, pool=None),
    ]
    result = run_plan(asks, machines, holders)
    assert result.preemptions == {}
    assert result.reasons == {
        10: "Next to run: waiting for stopping to stop",
        11: "Queued behind first",
    }


def test_runs_of_two_pools_each_preempt_their_own_victims() -> None:
    # seed L-62
    machines = [
        machine(1, "node-a", pool="a100", free=[]),
        machine(2, "node-h", pool="h100", free=[]),
    ]
    holders = [
        holder(20, "low-a", on=[(1, range(8))], cost=5),
        holder(21, "low-h", on=[(2, range(8))], cost=1),
    ]
    asks = [
        ask(10, "urgent-a", gpus=8, priority=3, pool="a100"),
        ask(11, "urgent-h", gpus=8, priority=2, pool="h100"),
    ]
    result = run_plan(asks, machines, holders)
    assert result.preemptions == {20: "urgent-a", 21: "urgent-h"}
    assert result.reasons == {
        10: "Next to run: waiting for low-a to stop",
        11: "Next to run: waiting for low-h to stop",
    }


# -- workspaces never meet -----------------------------------------------------------------------


def test_a_run_queued_behind_another_workspaces_run_is_not_told_its_name() -> None:
    # issue 18: a reason names a run only to that run's own workspace
    machines = [machine(1, "node-a", free=[0, 1])]
    asks = [
        ask(10, "secret-big", gpus=4, workspace_id=2, workspace="audio"),
        ask(11, "mine-big", gpus=4, queued=1),
        ask(12, "mine", gpus=1, queued=2),
    ]
    result = run_plan(asks, machines)
    assert result.reasons == {
        10: "No machine fits: none has room now for a worker of 4 GPUs, 1 core"
        " (GPUs short on node-a)",
        11: "Queued behind a run of another workspace",
        12: "Queued behind a run of another workspace",
    }
    assert result.blockers == {11: 10, 12: 10}
    # Within a workspace the seed's sentence names the run.
    same = run_plan([ask(10, "big", gpus=4), ask(11, "small", gpus=1, queued=1)], machines)
    assert same.reasons[11] == "Queued behind big"


def test_by_default_a_run_preempts_only_its_own_workspaces_runs() -> None:
    # issue 18: a member's own number never stops another workspace's run
    machines = [machine(1, "node-a", free=[])]
    holders = [
        holder(20, "theirs", on=[(1, [0, 1, 2, 3])], cost=1, workspace_id=2),
        holder(21, "mine", on=[(1, [4, 5, 6, 7])], cost=900),
    ]
    result = run_plan([ask(10, "urgent", gpus=4, priority=100)], machines, holders)
    assert result.preemptions == {21: "urgent"}
    assert result.reasons == {10: "Next to run: waiting for mine to stop"}
    alone = run_plan([ask(10, "urgent", gpus=4, priority=100)], machines, holders[:1])
    assert alone.preemptions == {}
    assert alone.reasons == {
        10: "No machine fits: none has room now for a worker of 4 GPUs, 1 core"
        " (GPUs short on node-a)"
    }


def test_the_admins_policy_lets_a_run_preempt_a_workspace_over_its_quota_unnamed() -> None:
    # issue 18: preempting another workspace's run needs the policy and that workspace over quota
    machines = [machine(1, "node-a", free=[])]
    holders = [
        holder(20, "over-1", on=[(1, [0, 1, 2, 3])], cost=1, workspace_id=2),
        holder(21, "over-2", on=[(1, [4, 5, 6, 7])], cost=2, workspace_id=2),
    ]
    quotas = {2: Quota("audio", CLUSTER, 4)}  # lowered: it holds 8
    asks = [ask(10, "urgent", gpus=4, priority=90), ask(11, "next", gpus=4, priority=90, queued=1)]
    result = run_plan(asks, machines, holders, quotas, {2: 8}, preempt_over_quota=True)
    # One run brings audio back within its quota; its other run is spared.
    assert result.preemptions == {20: "a run of another workspace"}
    assert result.preempted_for == {20: 10}
    assert result.reasons == {
        10: "Next to run: waiting for a run of another workspace to stop",
        11: "Queued behind urgent",
    }
    assert result.waits == {10: [20]}
    # Within its quota, or without the policy, nothing of audio's is preempted.
    within = run_plan(
        asks, machines, holders, {2: Quota("audio", CLUSTER, 8)}, {2: 8}, preempt_over_quota=True
    )
    assert within.preemptions == {}
    without = run_plan(asks, machines, holders, quotas, {2: 8})
    assert without.preemptions == {}


def test_a_run_waiting_for_other_workspaces_stopping_runs_counts_them_unnamed() -> None:
    machines = [machine(1, "node-a", free=[])]
    holders = [
        holder(20, "theirs-a", on=[(1, [0, 1])], stopping=True, workspace_id=2),
        holder(21, "theirs-b", on=[(1, [2, 3])], stopping=True, workspace_id=3),
        holder(22, "mine", on=[(1, [4, 5])], stopping=True),
    ]
    result = run_plan([ask(10, "urgent", gpus=6, priority=5)], machines, holders)
    assert result.preemptions == {}
    assert result.reasons == {
        10: "Next to run: waiting for mine, 2 runs of other workspaces to stop"
    }


# -- machine states -----------------------------------------------------------------------------


def test_draining_and_lost_machines_get_no_placements() -> None:
    machines = [
        machine(1, "node-drain", state="draining"),
        machine(2, "node-lost", state="lost"),
        machine(3, "node-gone", state="removed"),
        machine(4, "node-ready", free=[6, 7]),
    ]
    asks = [ask(10, "fits", gpus=2), ask(11, "too-big", gpus=4, queued=1)]
    result = run_plan(asks, machines)
    assert result.placements == {10: [Placement(4, "node-ready", (6, 7))]}
    # The draining machine could hold it some day: it waits rather than cannot be planned.
    assert result.reasons == {
        11: "No machine fits: none has room now for a worker of 4 GPUs, 1 core"
        " (GPUs short on node-ready)"
    }


def test_runs_on_draining_machines_are_not_preempted_for_room_nobody_can_use() -> None:
    machines = [machine(1, "node-drain", state="draining", free=[])]
    holders = [holder(20, "low", on=[(1, range(8))])]
    result = run_plan([ask(10, "urgent", gpus=8, priority=5)], machines, holders)
    assert result.preemptions == {}
    assert result.reasons == {10: "No machine fits: gpu-east has no ready machine"}


def test_machine_reasons_say_why_a_worker_fits_or_not_on_each_machine() -> None:
    # seed L-61: the per-machine reasons, by machine name
    machines = [
        machine(1, "f-lost", state="lost"),
        machine(2, "e-drain", state="draining"),
        machine(3, "d-removed", state="removed"),
        machine(4, "c-other-pool", pool="h100"),
        machine(
            5,
            "b-short",
            pool="a100",
            gpus=7,
            unhealthy=1,
            free=[0],
            cpu=16,
            cpu_free=2,
            memory=64 * GIB,
            memory_free=8 * GIB,
        ),
        machine(6, "a-room", pool="a100", free=range(8), cpu_free=10),
        machine(7, "g-gpu-only", pool="a100", free=[0, 1, 2]),
    ]
    wanted = ask(10, "llm", workers=3, gpus=2, cpu=4, memory=16 * GIB, pool="a100")
    assert machine_reasons(wanted, machines) == [
        ("a-room", "room for 2 of its 3 workers"),
        (
            "b-short",
            "1 of 8 GPUs free (1 unhealthy), a worker needs 2; "
            "2 of 16 cores free, a worker needs 4; "
            "8 GiB of 64 GiB memory free, a worker needs 16 GiB",
        ),
        ("c-other-pool", "not in pool a100"),
        ("d-removed", "removed: takes no work"),
        ("e-drain", "draining: takes no new work"),
        ("f-lost", "lost: its lease expired"),
        ("g-gpu-only", "room for 1 of its 3 workers"),
    ]


def test_machine_reasons_name_the_free_and_unhealthy_gpus() -> None:
    # seed L-61
    m = machine(1, "node-a", gpus=6, unhealthy=2, free=[0])
    assert machine_reasons(ask(10, "llm", gpus=2), [m]) == [
        ("node-a", "1 of 8 GPUs free (2 unhealthy), a worker needs 2")
    ]
    m = machine(1, "node-a", gpus=8, free=[0])
    assert machine_reasons(ask(10, "llm", gpus=2), [m]) == [
        ("node-a", "1 of 8 GPUs free, a worker needs 2")
    ]
    m = machine(1, "node-a", gpus=0, cpu=8)
    assert machine_reasons(ask(10, "etl", workers=4, gpus=0, cpu=3), [m]) == [
        ("node-a", "room for 2 of its 4 workers")
    ]
    assert machine_reasons(ask(10, "etl", workers=4, gpus=0, cpu=0), [m]) == [
        ("node-a", "room for 4 of its 4 workers")
    ]
