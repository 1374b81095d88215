"""Issue 21: memory in a reason as a person writes it (it read `23.5406 GiB`)."""

from __future__ import annotations

from backend.scheduling.pending_reasons import machine_reasons
from backend.scheduling.placement import GIB, MIB
from tests.support.scheduling import ask, machine


def test_memory_is_rounded_as_a_person_would() -> None:
    # seed L-61's per-machine reason: tenths of a GiB, MiB below one; what is free is rounded
    # down and what a worker needs up, so a shortfall never reads as enough
    machines = [
        machine(1, "a-short", memory=64 * GIB, memory_free=int(23.5406 * GIB)),
        machine(2, "b-tiny", memory=int(40.96 * GIB), memory_free=512 * MIB),
        machine(3, "c-nearly", memory=64 * GIB, memory_free=int(23.99 * GIB)),
    ]
    wanted = ask(10, "llm", workers=1, gpus=1, cpu=1, memory=24 * GIB)
    assert machine_reasons(wanted, machines) == [
        ("a-short", "23.5 GiB of 64 GiB memory free, a worker needs 24 GiB"),
        ("b-tiny", "512 MiB of 41 GiB memory free, a worker needs 24 GiB"),
        ("c-nearly", "23.9 GiB of 64 GiB memory free, a worker needs 24 GiB"),
    ]
