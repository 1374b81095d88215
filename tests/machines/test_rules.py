"""What a machine may say of itself when it registers: each field within its bound, or a
sentence naming the field and the bound."""

from __future__ import annotations

import pytest

from backend.machines.rules import GpuFacts, MachineFacts, name_problem, registration_problem


def facts(**changes: object) -> MachineFacts:
    base: dict[str, object] = {
        "name": "gpu-07.rack-4",
        "pool": "h100",
        "cpu_cores": 64.0,
        "memory_bytes": 512 * 2**30,
        "gpus": tuple(
            GpuFacts(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 80 * 2**30, "") for i in range(8)
        ),
        "agent_version": "0.2.0",
        "known_workers": 3,
    }
    base.update(changes)
    return MachineFacts(**base)  # type: ignore[arg-type]


def gpu(index: int = 0, **changes: object) -> GpuFacts:
    base: dict[str, object] = {
        "index": index,
        "uuid": "GPU-0",
        "model": "Simulated GPU",
        "memory_bytes": 0,
        "health_reason": "",
    }
    base.update(changes)
    return GpuFacts(**base)  # type: ignore[arg-type]


def test_a_real_machine_is_within_every_bound() -> None:
    assert registration_problem(facts()) is None
    assert registration_problem(facts(gpus=(), pool="")) is None  # no GPUs, no pool: fine


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"name": ""}, "machine must not be empty"),
        ({"name": "a" * 254}, "machine must be at most 253 characters (got 254)"),
        (
            {"name": "-evil"},
            "machine may hold only letters, digits, '-', '.' and '_', beginning and ending with "
            "a letter or a digit",
        ),
        (
            {"name": "gpu 07"},
            "machine may hold only letters, digits, '-', '.' and '_', "
            "beginning and ending with a letter or a digit",
        ),
        ({"pool": "p" * 64}, "pool must be at most 63 characters (got 64)"),
        (
            {"cpu_cores": float("nan")},
            "cpu_cores must be a number above 0 and at most 4096 (got nan)",
        ),
        (
            {"cpu_cores": float("-inf")},
            "cpu_cores must be a number above 0 and at most 4096 (got -inf)",
        ),
        ({"cpu_cores": 0.0}, "cpu_cores must be a number above 0 and at most 4096 (got 0.0)"),
        ({"cpu_cores": 4097.0}, "cpu_cores must be a number above 0 and at most 4096 (got 4097.0)"),
        (
            {"memory_bytes": 0},
            "memory_bytes must be above 0 and at most 70368744177664 (64 TiB) (got 0)",
        ),
        ({"agent_version": "v" * 65}, "agent_version must be at most 64 characters (got 65)"),
        ({"known_workers": 10_001}, "workers must list at most 10000 (got 10001)"),
        ({"gpus": tuple(gpu(i) for i in range(65))}, "gpus must list at most 64 GPUs (got 65)"),
        ({"gpus": (gpu(1024),)}, "gpus[0].index must be at most 1023 (got 1024)"),
        ({"gpus": (gpu(0), gpu(0))}, "gpus[1].index repeats GPU 0"),
        ({"gpus": (gpu(uuid="u" * 97),)}, "gpus[0].uuid must be at most 96 characters (got 97)"),
        (
            {"gpus": (gpu(model="m" * 129),)},
            "gpus[0].model must be at most 128 characters (got 129)",
        ),
        (
            {"gpus": (gpu(health_reason="r" * 501),)},
            "gpus[0].health_reason must be at most 500 characters (got 501)",
        ),
        (
            {"gpus": (gpu(memory_bytes=2**43),)},
            f"gpus[0].memory_bytes must be at most {4 * 2**40} (4 TiB) (got {2**43})",
        ),
    ],
)
def test_each_field_out_of_bounds_is_named_with_its_bound(
    changes: dict[str, object], problem: str
) -> None:
    assert registration_problem(facts(**changes)) == problem


def test_host_names_as_machines_report_them_are_machine_names() -> None:
    for name in ("local", "gpu-07", "GPU07.example.com", "node_3", "a"):
        assert name_problem("machine", name) is None
