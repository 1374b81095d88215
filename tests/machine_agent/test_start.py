"""A worker's start (agent/start.py): read once from the protocol's StartWorker, kept in its
folder as payload.json with the keys it always had, and read back from it."""

from __future__ import annotations

import pytest
from astraeus.agent.v1 import agent_pb2

from agent.start import Credential, Mount, StartSpec

pytestmark = pytest.mark.unit

KEY = "Z3lS0Nbz6fntndMhehv97A"


def message() -> agent_pb2.StartWorker:
    start = agent_pb2.StartWorker(
        worker="ddp-1",
        run="ddp",
        rank=1,
        attempt=3,
        workspace_id=7,
        command=["torchrun", "train.py"],
        environment={"WANDB_MODE": "offline"},
        astraeus_environment={"RANK": "1", "WORLD_SIZE": "2"},
        mounts=[
            agent_pb2.Mount(drive="data", path="/data", fill_from="/srv/set", read_only=True),
            agent_pb2.Mount(drive="out", path="out"),
        ],
        credentials=[agent_pb2.Credential(secret="hf", env="HF_TOKEN")],
        gpu_ids=[4, 6],
        gang_addresses=["10.0.0.1", "10.0.0.2"],
        worker_key=KEY,
    )
    start.cpu_request = 0.5
    start.memory_limit_bytes = 2**30
    return start


def test_the_message_is_read_once_into_a_typed_start() -> None:
    spec = StartSpec.of(message())
    assert spec == StartSpec(
        worker="ddp-1",
        run="ddp",
        rank=1,
        attempt=3,
        workspace_id=7,
        command=("torchrun", "train.py"),
        environment={"WANDB_MODE": "offline"},
        astraeus_environment={"RANK": "1", "WORLD_SIZE": "2"},
        mounts=(Mount("data", "/data", "/srv/set", True), Mount("out", "out")),
        credentials=(Credential("hf", env="HF_TOKEN"),),
        cpu_request=0.5,
        memory_limit_bytes=2**30,
        gpu_ids=(4, 6),
        gang_addresses=("10.0.0.1", "10.0.0.2"),
        worker_key=KEY,
    )
    with pytest.raises(TypeError):  # frozen: its variables are read, never changed
        spec.environment["X"] = "1"  # type: ignore[index]


def test_it_is_kept_with_the_keys_payload_json_always_had_and_read_back() -> None:
    spec = StartSpec.of(message()).with_uid(2_000_017)
    kept = spec.to_json()
    assert kept == {
        "worker": "ddp-1",
        "run": "ddp",
        "rank": 1,
        "attempt": 3,
        "workspace_id": 7,
        "image": None,
        "command": ["torchrun", "train.py"],
        "user": None,
        "working_dir": None,
        "environment": {"WANDB_MODE": "offline"},
        "astraeus_environment": {"RANK": "1", "WORLD_SIZE": "2"},
        "mounts": [
            {"drive": "data", "path": "/data", "fill_from": "/srv/set", "read_only": True},
            {"drive": "out", "path": "out", "fill_from": None, "read_only": False},
        ],
        "credentials": [{"secret": "hf", "env": "HF_TOKEN", "file": None}],
        "cpu": None,
        "cpu_request": 0.5,
        "memory_limit_bytes": 2**30,
        "gpu_ids": [4, 6],
        "gang_addresses": ["10.0.0.1", "10.0.0.2"],
        "worker_key": KEY,
        "uid": 2_000_017,
    }
    assert StartSpec.from_json(kept) == spec


def test_a_start_an_earlier_agent_kept_is_read_with_the_defaults_for_what_it_lacks() -> None:
    # before worker keys, gang addresses and CPU shares (issue 37), a payload.json said less
    kept = {"worker": "train-0", "attempt": 1, "workspace_id": 2, "command": ["python", "t.py"]}
    assert StartSpec.from_json(kept) == StartSpec(
        worker="train-0", attempt=1, workspace_id=2, command=("python", "t.py")
    )
