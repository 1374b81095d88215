"""The run specification: every refused value names its field and the reason."""

from typing import Any

import pytest

from backend.errors import FieldError, InvalidInput
from backend.runs.spec import parse_spec
from tests.support import run_spec


def refused(spec: Any) -> list[FieldError]:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(spec)
    assert caught.value.code == "INVALID_SPEC"
    assert caught.value.status == 400
    return caught.value.fields


def test_a_full_specification_is_kept_in_its_canonical_form() -> None:
    spec = parse_spec(
        run_spec(
            image="nvcr.io/nvidia/pytorch:24.05-py3",
            user="1000",
            environment={"NCCL_DEBUG": "WARN"},
            mounts=[{"drive": "data", "path": "/data", "read_only": True}],
            priority=80,
            restart_policy="never",
            max_restarts=3,
            time_limit=43200,
            stall_timeout="30m",
            on_stall="keep",
        )
    )
    assert spec.to_json() == {
        "name": "llama-sft",
        "cluster": None,
        "pool": None,
        "workers": 2,
        "gpus": 1,
        "cpu": 4.0,
        "memory_bytes": 16 * 2**30,
        "per_gpu": None,
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "command": ["python", "train.py"],
        "user": "1000",
        "environment": {"NCCL_DEBUG": "WARN"},
        "mounts": [{"drive": "data", "path": "/data", "read_only": True, "fill_from": None}],
        "credentials": [],
        "priority": 80,
        "restart_policy": "never",
        "max_restarts": 3,
        "time_limit": "12h",
        "stall_timeout": "30m",
        "on_stall": "keep",
    }
    # What "Run again" opens is accepted again unchanged.
    assert parse_spec(spec.to_json()) == spec


def test_defaults_are_one_worker_without_gpus_restarting_ten_times() -> None:
    spec = parse_spec({"name": "tiny", "command": ["true"]})
    assert (spec.workers, spec.gpus, spec.priority) == (1, 0, 50)
    assert (spec.restart_policy, spec.max_restarts) == ("on_failure", 10)
    assert spec.time_limit is None


def test_memory_limit_is_memory_bytes_or_per_gpu_memory_times_gpus() -> None:
    assert parse_spec(run_spec(memory_bytes=1000)).memory_limit_bytes == 1000
    per_gpu = run_spec(memory_bytes=None, gpus=4, per_gpu={"memory_bytes": 10})
    assert parse_spec(per_gpu).memory_limit_bytes == 40


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"workers": 0}, [FieldError("workers", "must be at least 1")]),
        ({"workers": 5000}, [FieldError("workers", "must be at most 4096")]),
        ({"gpus": -1}, [FieldError("gpus", "must be at least 0")]),
        ({"gpus": "two"}, [FieldError("gpus", "must be a whole number")]),
        ({"cpu": 0}, [FieldError("cpu", "must be more than 0")]),
        ({"memory_bytes": -5}, [FieldError("memory_bytes", "must be more than 0")]),
        ({"time_limit": "-5h"}, [FieldError("time_limit", "must not be negative")]),
        ({"time_limit": -60}, [FieldError("time_limit", "must not be negative")]),
        ({"time_limit": "0s"}, [FieldError("time_limit", "must be longer than 0s")]),
        (
            {"time_limit": "soon"},
            [FieldError("time_limit", "must be a duration such as 30s, 15m, 12h or 1h30m")],
        ),
        ({"priority": 101}, [FieldError("priority", "must be at most 100")]),
        (
            {"restart_policy": "always"},
            [FieldError("restart_policy", "must be one of 'on_failure' or 'never'")],
        ),
        (
            {"command": []},
            [
                FieldError(
                    "command", "must name a program: a non-empty list whose first item is not empty"
                )
            ],
        ),
        ({"command": "python train.py"}, [FieldError("command", "must be a list")]),
        ({"command": None}, [FieldError("command", "is required when no image is given")]),
        (
            {"mounts": [{"drive": "data", "path": "data"}]},
            [FieldError("mounts[0].path", "must be an absolute path")],
        ),
        (
            {"mounts": [{"drive": "a", "path": "/x"}, {"drive": "b", "path": "/x"}]},
            [FieldError("mounts", "two mounts share a path")],
        ),
        (
            {"environment": {"RANK": "3"}},
            [FieldError("environment.RANK", "is set by Astraeus for every worker")],
        ),
        (
            {"environment": {"1X": "3"}},
            [FieldError("environment.1X", "is not a valid variable name")],
        ),
        (
            {"per_gpu": {"memory_bytes": 8}},
            [
                FieldError(
                    "per_gpu.memory_bytes", "give memory_bytes or per_gpu.memory_bytes, not both"
                )
            ],
        ),
        (
            {"gpus": 0, "memory_bytes": None, "per_gpu": {"memory_bytes": 8}},
            [FieldError("per_gpu.memory_bytes", "the worker asks for no GPUs")],
        ),
        ({"gpu": 1}, [FieldError("gpu", "is not a field of a run specification")]),
        (
            {"name": "Llama SFT"},
            [
                FieldError(
                    "name",
                    "must be lowercase letters, digits and '-', starting and ending "
                    "with a letter or digit, at most 63 characters",
                )
            ],
        ),
    ],
)
def test_each_bad_value_is_named_with_its_reason(
    overrides: dict[str, Any], expected: list[FieldError]
) -> None:
    assert refused(run_spec(**overrides)) == expected


def test_every_bad_field_is_reported_at_once() -> None:
    fields = refused(run_spec(workers=0, gpus=-2, time_limit="-1h", bogus=True))
    assert [f.field for f in fields] == ["workers", "gpus", "time_limit", "bogus"]


def test_a_missing_name_and_a_non_object_are_refused() -> None:
    assert refused({"command": ["x"]}) == [FieldError("name", "is required")]
    assert refused(["not", "an", "object"]) == [FieldError("spec", "must be a JSON object")]


def test_credentials_go_to_one_variable_or_one_file_each() -> None:
    spec = run_spec(
        environment={"HF_HOME": "/cache"},
        credentials=[
            {"secret": "hf-token"},
            {"secret": "x", "env": "RANK"},
            {"secret": "y", "env": "1A"},
            {"secret": "z", "file": "../etc/passwd"},
        ],
        mounts=[{"drive": "data", "path": "/data", "fill_from": "relative/folder"}],
    )
    assert [(f.field, f.reason) for f in refused(spec)] == [
        ("mounts[0].fill_from", "must be an absolute path"),
        ("credentials[0]", "give env or file (one of them)"),
        ("credentials[2].env", "is not a valid variable name"),
        ("credentials[3].file", "must be a file name: letters, digits, '.', '_' and '-', no '/'"),
    ]
    clash = run_spec(
        environment={"HF_TOKEN": "x"},
        credentials=[
            {"secret": "a", "env": "RANK"},
            {"secret": "b", "env": "HF_TOKEN"},
            {"secret": "c", "file": "t"},
            {"secret": "d", "file": "t"},
        ],
    )
    assert [(f.field, f.reason) for f in refused(clash)] == [
        ("credentials[0].env", "is set by Astraeus for every worker"),
        ("credentials[1].env", "is also given in environment"),
        ("credentials", "two credentials go to the same variable or file"),
    ]
