"""Issue 21: "No machine fits" names what is short on each machine (seed L-61).

Before, a worker of 1 GPU, 1 core waiting where GPUs were free and only cores were short read
"No machine fits: none has room now for a worker of 1 GPU, 1 core", as if GPUs were short too.
"""

from __future__ import annotations

from backend.scheduling.pending_reasons import machine_reasons
from backend.scheduling.placement import GIB
from tests.support.scheduling import ask, machine, run_plan

HEAD = "No machine fits: none has room now for a worker of "


def test_cores_short_with_gpus_free() -> None:
    # seed L-61
    machines = [
        machine(1, "node-a", free=[0, 1, 2, 3], cpu=8, cpu_free=0.5),
        machine(2, "node-b", free=[5], cpu=8, cpu_free=0),
    ]
    a = ask(10, "eval", gpus=1, cpu=1)
    result = run_plan([a], machines)
    assert result.placements == {}
    assert result.reasons == {10: HEAD + "1 GPU, 1 core (cores short on node-a, node-b)"}
    # The per-machine numbers behind it: Read a pending reason.
    assert machine_reasons(a, machines) == [
        ("node-a", "0.5 of 8 cores free, a worker needs 1"),
        ("node-b", "0 of 8 cores free, a worker needs 1"),
    ]


def test_memory_short_with_gpus_and_cores_free() -> None:
    # seed L-61
    machines = [machine(1, "node-a", memory=64 * GIB, memory_free=8 * GIB)]
    result = run_plan([ask(10, "llm", gpus=2, cpu=4, memory=16 * GIB)], machines)
    assert result.reasons == {10: HEAD + "2 GPUs, 4 cores, 16 GiB (memory short on node-a)"}


def test_gpus_short_with_cores_and_memory_free() -> None:
    # seed L-61
    machines = [machine(1, "node-a", free=[0, 1]), machine(2, "node-b", free=[])]
    result = run_plan([ask(10, "llm", gpus=4)], machines)
    assert result.reasons == {10: HEAD + "4 GPUs, 1 core (GPUs short on node-a, node-b)"}


def test_each_machine_says_its_own_short_resources() -> None:
    # seed L-61
    machines = [
        machine(1, "node-a", free=[0], cpu_free=0),
        machine(2, "node-b", free=[0, 1, 2, 3], memory_free=GIB),
        machine(3, "node-c", free=[0, 1], cpu_free=16),
    ]
    result = run_plan([ask(10, "llm", gpus=2, cpu=32, memory=8 * GIB)], machines)
    assert result.reasons == {
        10: HEAD + "2 GPUs, 32 cores, 8 GiB "
        "(GPUs and cores short on node-a; memory short on node-b; cores short on node-c)"
    }


def test_many_machines_short_of_the_same_are_counted_past_three() -> None:
    # seed L-61
    machines = [machine(i, f"node-{i}", cpu_free=0) for i in range(1, 7)]
    result = run_plan([ask(10, "eval", gpus=1, cpu=1)], machines)
    assert result.reasons == {
        10: HEAD + "1 GPU, 1 core (cores short on node-1, node-2, node-3 and 3 more)"
    }


def test_machines_of_another_pool_are_not_named() -> None:
    # seed L-61
    machines = [
        machine(1, "node-a", pool="h100", cpu_free=0),
        machine(2, "node-b", pool="a100", cpu_free=0),
    ]
    result = run_plan([ask(10, "eval", gpus=1, cpu=1, pool="h100")], machines)
    assert result.reasons == {10: HEAD + "1 GPU, 1 core (cores short on node-a)"}
