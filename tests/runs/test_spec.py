"""The run specification: every refused value names its field and the reason."""

import time
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.errors import FieldError, InvalidInput
from backend.spec import parse_spec, stored_spec
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


# issue 36: one rule for every machine, checked here (the agent's is the same: a relative path
# under the worker's own folder, an absolute one where its machine allows mounts)
def test_a_mount_path_may_be_relative_or_absolute() -> None:
    mounts = [
        {"drive": "data", "path": "data"},
        {"drive": "ckpt", "path": "runs/ckpt", "read_only": False},
        {"drive": "ref", "path": "/models/ref", "read_only": True},
        {"drive": "ref", "path": "ref..v2", "read_only": True},
    ]
    spec = parse_spec(run_spec(mounts=mounts))
    assert [(m.path, m.read_only) for m in spec.mounts] == [
        ("data", False),
        ("runs/ckpt", False),
        ("/models/ref", True),
        ("ref..v2", True),
    ]


def test_defaults_are_one_worker_without_gpus_restarting_ten_times() -> None:
    spec = parse_spec({"name": "tiny", "command": ["true"]})
    assert (spec.workers, spec.gpus, spec.priority) == (1, 0, 50)
    assert (spec.restart_policy, spec.max_restarts) == ("on_failure", 10)
    assert spec.time_limit is None


def test_a_stored_specification_reads_back_as_submitted_with_its_cluster_and_pool() -> None:
    submitted = parse_spec(
        {"name": "r", "command": ["true"], "stall_timeout": "90s", "on_stall": "keep"}
    )
    stored = submitted.to_json() | {"cluster": "local", "pool": None}
    spec = stored_spec(stored)
    assert spec.to_json() == stored
    assert (spec.stall_timeout_delta, spec.on_stall) == (timedelta(seconds=90), "keep")
    # cpu not given: none stored, a tenth of a core reserved (issue 36)
    assert (spec.max_restarts, spec.restart_policy, spec.cpu) == (10, "on_failure", None)
    assert spec.cpu_reserved == 0.1


def test_a_key_an_older_version_stored_is_left_out_and_a_newer_field_takes_its_default() -> None:
    stored = {"name": "old", "command": ["true"], "cluster": "local", "retired": True}
    spec = stored_spec(stored)
    assert (spec.name, spec.on_stall, spec.stall_timeout_delta) == ("old", "restart", None)


def test_a_stored_specification_an_older_version_accepted_is_read_as_it_was() -> None:
    # 64 credentials: more than a specification may name now (32)
    credentials = [{"secret": f"s{i}", "env": f"S{i}"} for i in range(64)]
    stored = parse_spec(run_spec()).to_json() | {"credentials": credentials}
    spec = stored_spec(stored)
    assert [c.secret for c in spec.credentials] == [f"s{i}" for i in range(64)]
    # a part's default is its model's own too
    full = [c | {"file": None} for c in credentials]
    assert spec.to_json() == stored | {"credentials": full}


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
        # issue 36: relative paths are under the worker's own folder; nothing climbs out
        (
            {"mounts": [{"drive": "data", "path": "../data"}]},
            [FieldError("mounts[0].path", "must not contain '..'")],
        ),
        (
            {"mounts": [{"drive": "data", "path": "/data/../etc"}]},
            [FieldError("mounts[0].path", "must not contain '..'")],
        ),
        (
            {"mounts": [{"drive": "data", "path": ""}]},
            [FieldError("mounts[0].path", "must not be empty")],
        ),
        (
            {"mounts": [{"drive": "data", "path": "/"}]},
            [FieldError("mounts[0].path", "must not be the root folder")],
        ),
        (
            {"mounts": [{"drive": "data", "path": "./"}]},
            [
                FieldError(
                    "mounts[0].path",
                    "must name a folder in the worker's own folder, not that folder",
                )
            ],
        ),
        (
            {"mounts": [{"drive": "a", "path": "/x"}, {"drive": "b", "path": "/x"}]},
            [FieldError("mounts", "two mounts share a path")],
        ),
        (
            {"mounts": [{"drive": "a", "path": "data"}, {"drive": "b", "path": "./data/"}]},
            [FieldError("mounts", "two mounts share a path")],
        ),
        (
            {
                "mounts": [
                    {"drive": "a", "path": "/a", "read_only": True},
                    {"drive": "a", "path": "/b"},
                    {"drive": "a", "path": "/c", "read_only": True},
                ]
            },
            [
                FieldError(
                    f"mounts[{i}].read_only",
                    "drive a is also mounted writable (mounts[1]): a drive is read-only in a "
                    "worker everywhere or nowhere",
                )
                for i in (0, 2)
            ],
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


# issue 17: variables that select devices or Astraeus's behaviour are Astraeus's alone.
SET_BY_ASTRAEUS = "is set by Astraeus for every worker"
SELECTS_DEVICES = "selects devices, which Astraeus does for every worker"
ASTRAEUS_PREFIX = "starts with ASTRAEUS_, which is reserved for Astraeus"
CONTROL_CHARACTERS = [chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]]
LINE_BREAKS_AND_TAB = ["\t", "\n", "\r"]


def control(character: str) -> str:
    return f"must not contain control characters (found U+{ord(character):04X})"


# issue 17
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("RANK", SET_BY_ASTRAEUS),
        ("CUDA_VISIBLE_DEVICES", SET_BY_ASTRAEUS),
        ("ASTRAEUS_RUN", SET_BY_ASTRAEUS),
        ("ASTRAEUS_WORKER", SET_BY_ASTRAEUS),
        ("NVIDIA_VISIBLE_DEVICES", SELECTS_DEVICES),
        ("NVIDIA_DRIVER_CAPABILITIES", SELECTS_DEVICES),
        ("NVIDIA_REQUIRE_CUDA", SELECTS_DEVICES),
        ("CUDA_DEVICE_ORDER", SELECTS_DEVICES),
        ("HIP_VISIBLE_DEVICES", SELECTS_DEVICES),
        ("ROCR_VISIBLE_DEVICES", SELECTS_DEVICES),
        ("GPU_DEVICE_ORDINAL", SELECTS_DEVICES),
        ("ASTRAEUS_", ASTRAEUS_PREFIX),
        ("ASTRAEUS_PROGRESS_FILE", ASTRAEUS_PREFIX),
        ("ASTRAEUS_DRIVE_DATA", ASTRAEUS_PREFIX),
        ("ASTRAEUS_SECRETS_DIR", ASTRAEUS_PREFIX),
        ("ASTRAEUS_AGENT_TOKEN", ASTRAEUS_PREFIX),
    ],
)
def test_a_reserved_variable_is_refused_in_environment_and_as_a_credential(
    name: str, reason: str
) -> None:
    assert refused(run_spec(environment={name: "0"})) == [FieldError(f"environment.{name}", reason)]
    assert refused(run_spec(credentials=[{"secret": "token", "env": name}])) == [
        FieldError("credentials[0].env", reason)
    ]


# issue 17: a prefix rule, not a list
@settings(max_examples=200, deadline=None)
@given(suffix=st.from_regex(r"[A-Za-z0-9_]*", fullmatch=True))
def test_every_name_starting_with_astraeus_is_refused(suffix: str) -> None:
    name = f"ASTRAEUS_{suffix}"
    expected = SET_BY_ASTRAEUS if name in {"ASTRAEUS_RUN", "ASTRAEUS_WORKER"} else ASTRAEUS_PREFIX
    assert refused(run_spec(environment={name: "x"})) == [
        FieldError(f"environment.{name}", expected)
    ]
    assert refused(run_spec(credentials=[{"secret": "token", "env": name}])) == [
        FieldError("credentials[0].env", expected)
    ]


# issue 17: the rule names exact variables (case matters), not every name that looks alike
def test_names_near_the_reserved_ones_are_the_users() -> None:
    environment = {
        "astraeus_run": "1",
        "MY_ASTRAEUS_RUN": "1",
        "ASTRAEUS": "1",
        "NVIDIA_TF32_OVERRIDE": "0",
        "CUDA_HOME": "/usr/local/cuda",
        "CUDA_LAUNCH_BLOCKING": "1",
        "NCCL_DEBUG": "WARN",
    }
    assert parse_spec(run_spec(environment=environment)).environment == environment


# issue 17: a variable's name is checked with the other fields, all reported at once
def test_a_reserved_variable_is_reported_with_the_other_bad_fields() -> None:
    assert refused(run_spec(workers=0, environment={"NVIDIA_VISIBLE_DEVICES": "all"})) == [
        FieldError("workers", "must be at least 1"),
        FieldError("environment.NVIDIA_VISIBLE_DEVICES", SELECTS_DEVICES),
    ]


# issue 17: a name with '|' or ': ' in it is one refused field (it was a server error)
@pytest.mark.parametrize("name", ["X|Y", "A: B", "A|B: C|D"])
def test_an_odd_variable_name_is_one_refused_field(name: str) -> None:
    assert refused(run_spec(environment={name: "1"})) == [
        FieldError(f"environment.{name}", "is not a valid variable name")
    ]


# issue 17: scripts span lines
def test_command_arguments_and_variable_values_may_span_lines_with_tabs() -> None:
    script = "import os\nfor k in sorted(os.environ):\n\tprint(k)\r\n"
    spec = parse_spec(
        run_spec(
            command=["python3", "-c", script],
            environment={"BANNER": "line one\nline two\tcolumn\r\n"},
        )
    )
    assert spec.command == ["python3", "-c", script]
    assert spec.environment == {"BANNER": "line one\nline two\tcolumn\r\n"}
    assert parse_spec(spec.to_json()) == spec


# issue 17
def test_nul_in_a_command_argument_is_refused_naming_the_argument() -> None:
    assert refused(run_spec(command=["python3", "-c", "print(1)\x00"])) == [
        FieldError("command[2]", "must not contain control characters (found U+0000)")
    ]


# issue 17: free text refuses every C0 control character but tab, newline and carriage return,
# and DEL
@pytest.mark.parametrize(
    "character", [c for c in CONTROL_CHARACTERS[:0x21] if c not in LINE_BREAKS_AND_TAB]
)
def test_free_text_refuses_control_characters_but_line_breaks_and_tab(character: str) -> None:
    text = f"before{character}after"
    assert refused(run_spec(command=["sh", "-c", text])) == [
        FieldError("command[2]", control(character))
    ]
    assert refused(run_spec(command=[text])) == [FieldError("command[0]", control(character))]
    assert refused(run_spec(environment={"NOTE": text})) == [
        FieldError("environment.NOTE", control(character))
    ]


# issue 17: every other string refuses every control character, tab and line breaks included
@pytest.mark.parametrize("character", CONTROL_CHARACTERS)
def test_names_keys_and_paths_refuse_every_control_character(character: str) -> None:
    c = character
    spec = run_spec(
        name=f"run{c}",
        cluster=f"local{c}",
        pool=f"{c}a100",
        image=f"nvcr.io/nvidia/pytorch:24.05{c}",
        user=f"1000{c}",
        time_limit=f"12h{c}",
        stall_timeout=f"{c}",
        mounts=[{"drive": f"data{c}", "path": f"/data{c}", "fill_from": f"/srv/{c}data"}],
        credentials=[
            {"secret": f"hf{c}token", "env": f"HF_TOKEN{c}"},
            {"secret": "ssh-key", "file": f"id{c}rsa"},
        ],
    )
    assert refused(spec) == [
        FieldError("name", control(c)),
        FieldError("cluster", control(c)),
        FieldError("pool", control(c)),
        FieldError("image", control(c)),
        FieldError("user", control(c)),
        FieldError("mounts[0].drive", control(c)),
        FieldError("mounts[0].path", control(c)),
        FieldError("mounts[0].fill_from", control(c)),
        FieldError("credentials[0].secret", control(c)),
        FieldError("credentials[0].env", control(c)),
        FieldError("credentials[1].file", control(c)),
        FieldError("time_limit", control(c)),
        FieldError("stall_timeout", control(c)),
    ]


# issue 17: a variable's name is checked like a name; the path shows it escaped
@pytest.mark.parametrize("character", CONTROL_CHARACTERS)
def test_a_variable_name_refuses_every_control_character(character: str) -> None:
    escaped = f"\\u{ord(character):04x}"
    assert refused(run_spec(environment={f"HF{character}HOME": "/cache"})) == [
        FieldError(f"environment.HF{escaped}HOME", control(character))
    ]


# issue 17: the first control character is the one named
def test_the_first_control_character_is_named() -> None:
    assert refused(run_spec(image="a\x1b[31mb\x00")) == [
        FieldError("image", "must not contain control characters (found U+001B)")
    ]
    assert refused(run_spec(environment={"A": "\tok\x7f\x00"})) == [
        FieldError("environment.A", "must not contain control characters (found U+007F)")
    ]


# issue 17: an unknown field's name is shown escaped too
def test_an_unknown_field_with_a_control_character_is_named_escaped() -> None:
    assert refused(run_spec(**{"gpu\x00s": 1})) == [
        FieldError("gpu\\u0000s", "is not a field of a run specification")
    ]


# --- bounds (issue 18): a specification travels whole in one start command ---------------

KIB, MIB = 1024, 2**20


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"environment": {"BIG": "x" * 5 * MIB}},
            "environment.BIG: a value is at most 64 KiB (this one is 5.0 MiB)",
        ),
        (
            {"environment": {f"V{i}": "x" * 60_000 for i in range(5)}},
            "environment: names and values are at most 256 KiB (this one is 293.0 KiB)",
        ),
        (
            {"environment": {f"V{i}": "" for i in range(1025)}},
            "environment: must have at most 1024 items",
        ),
        (
            {"environment": {"A" * 100_000: "1"}},
            f"environment.{'A' * 64}…: a name is at most 128 characters (this one has 100000)",
        ),
        (
            {"command": ["python", "y" * 70_000]},
            "command[1]: an argument is at most 64 KiB (this one is 68.4 KiB)",
        ),
        (
            {"command": ["python"] + ["y" * 60_000] * 5},
            "command: the arguments are at most 256 KiB (this one is 293.0 KiB)",
        ),
        (
            {"command": ["true"] * 4097},
            "command: must have at most 4096 items (this one has 4097)",
        ),
        (
            {"mounts": [{"drive": "data", "path": "/" + "a" * 5000}]},
            "mounts[0].path: a path is at most 4096 characters (this one has 5001)",
        ),
        (
            {"mounts": [{"drive": "data", "path": "/d", "fill_from": "/" + "a" * 4096}]},
            "mounts[0].fill_from: a path is at most 4096 characters (this one has 4097)",
        ),
        (
            {"mounts": [{"drive": "data", "path": f"/d{i}"} for i in range(65)]},
            "mounts: must have at most 64 items (this one has 65)",
        ),
        (
            {"credentials": [{"secret": "token", "env": f"T{i}"} for i in range(33)]},
            "credentials: must have at most 32 items (this one has 33)",
        ),
        (
            {"credentials": [{"secret": "token", "env": "T" * 129}]},
            "credentials[0].env: a name is at most 128 characters (this one has 129)",
        ),
        ({"cluster": "c" * 200}, "cluster: a name is at most 128 characters (this one has 200)"),
        ({"pool": "p" * 129}, "pool: a name is at most 128 characters (this one has 129)"),
    ],
)
def test_each_bound_is_named_with_its_field_and_the_size_found(
    overrides: dict[str, Any], expected: str
) -> None:
    assert [str(f) for f in refused(run_spec(**overrides))] == [expected]


def test_a_value_is_measured_in_bytes_of_utf8() -> None:
    # 21 846 three-byte characters: 64 KiB and 2 bytes
    fields = refused(run_spec(environment={"GREETING": "€" * 21_846}))
    assert [str(f) for f in fields] == [
        "environment.GREETING: a value is at most 64 KiB (this one is 64.0 KiB)"
    ]


def test_items_at_their_bounds_are_accepted() -> None:
    at_bounds = run_spec(
        command=["python"] + ["y" * 64 * KIB] * 3 + ["z" * (64 * KIB - 6)],
        environment={"V" + "A" * 127: "x" * (64 * KIB - 128 - 6)} | {"W": "x" * 64 * KIB},
        mounts=[{"drive": "data", "path": "/" + "a" * 4095}],
    )
    spec = parse_spec(at_bounds)
    assert sum(len(a) for a in spec.command or []) == 256 * KIB


def test_the_whole_specification_is_bounded_once_each_part_is_within_its_own() -> None:
    # Each part within its bound, together past 1 MiB: the start command stays far from 4 MiB.
    big = run_spec(
        image="i" * 512,
        command=["python"] + ["y" * 65_000] * 4,
        environment={f"V{i}": "x" * 65_000 for i in range(4)},
        mounts=[
            {"drive": "data", "path": f"/{i}" + "a" * 4090, "fill_from": "/" + "b" * 4095}
            for i in range(64)
        ],
        credentials=[{"secret": "token", "file": f"{i}" + "f" * 120} for i in range(32)],
    )
    [field] = refused(big)
    assert field.field == "spec"
    assert field.reason.startswith("a specification is at most 1 MiB (this one is 1.")
    assert field.reason.endswith(" MiB) as JSON")


def test_a_five_mib_value_is_refused_quickly() -> None:
    began = time.monotonic()
    refused(run_spec(environment={"BIG": "x" * 5 * MIB}, command=["python", "y" * 5 * MIB]))
    assert time.monotonic() - began < 1.0


def test_an_idle_policy_is_kept_with_its_window_as_written_and_its_defaults() -> None:
    # issue 41: idle: {gpu_utilization_below: 5, for: "30m", action: "stop" | "notify"}
    spec = parse_spec(run_spec(idle={"for": 1800}))
    assert spec.to_json()["idle"] == {"gpu_utilization_below": 5.0, "for": "30m", "action": "stop"}
    assert spec.idle is not None and spec.idle.window == timedelta(minutes=30)
    again = stored_spec(spec.to_json())
    assert again.idle == spec.idle
    told = parse_spec(
        run_spec(idle={"gpu_utilization_below": 12.5, "for": "2h", "action": "notify"})
    )
    assert told.to_json()["idle"] == {
        "gpu_utilization_below": 12.5,
        "for": "2h",
        "action": "notify",
    }
    assert parse_spec(run_spec()).idle is None


@pytest.mark.parametrize(
    ("idle", "field", "reason"),
    [
        (
            {"for": "90s"},
            "idle.for",
            "must be whole minutes: utilization is measured minute by minute",
        ),
        ({"for": "0s"}, "idle.for", "must be longer than 0s"),
        ({"for": "8d"}, "idle.for", "must be from 1m to 7d"),
        ({"for": "soon"}, "idle.for", None),
        ({}, "idle.for", "is required"),
        (
            {"for": "5m", "gpu_utilization_below": 0},
            "idle.gpu_utilization_below",
            "must be more than 0",
        ),
        (
            {"for": "5m", "gpu_utilization_below": 101},
            "idle.gpu_utilization_below",
            "must be at most 100",
        ),
        ({"for": "5m", "action": "kill"}, "idle.action", "must be one of 'stop' or 'notify'"),
        ({"window": "5m", "for": "5m"}, "idle.window", "is not a field of a run specification"),
        ("30m", "idle", "must be an object"),
    ],
)
def test_a_bad_idle_policy_names_its_field(idle: Any, field: str, reason: str | None) -> None:
    fields = refused(run_spec(idle=idle))
    assert [f.field for f in fields] == [field]
    if reason is not None:
        assert fields[0].reason == reason


def test_an_idle_policy_needs_gpus_to_measure() -> None:
    assert refused(run_spec(gpus=0, idle={"for": "30m"})) == [
        FieldError("idle", "the run asks for no GPUs: an idle policy measures its GPUs")
    ]
