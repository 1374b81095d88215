"""stopRun, deleteRun and a run's pending reasons through GraphQL, and what other workspaces get."""

from typing import Any

import httpx

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy, run_spec
from tests.support.api import CREATE, gql

STOP = """mutation($name: String!) {
  stopRun(name: $name) { run { name state reason } errors { code field message } }
}"""
DELETE = """mutation($name: String!) {
  deleteRun(name: $name) { run { name state reason } errors { code field message } }
}"""
REASONS = """query($name: String!) {
  run(name: $name) { state reason pendingReasons { machine reason } }
}"""


async def test_a_pending_run_is_stopped_at_once(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    await gql(client, tenancy.member_token, CREATE, spec=run_spec())
    answer = await gql(client, tenancy.member_token, STOP, name="llama-sft")
    assert answer["data"]["stopRun"] == {
        "run": {"name": "llama-sft", "state": "Stopped", "reason": "Stopped by alice"},
        "errors": [],
    }
    again = await gql(client, tenancy.member_token, STOP, name="llama-sft")
    assert again["data"]["stopRun"]["errors"] == [
        {
            "code": "RUN_ENDED",
            "field": None,
            "message": "The run 'llama-sft' has already ended (Stopped).",
        }
    ]


async def test_a_deleted_run_frees_its_name_and_stays_listed(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    await gql(client, tenancy.member_token, CREATE, spec=run_spec())
    deleted = await gql(client, tenancy.member_token, DELETE, name="llama-sft")
    assert deleted["data"]["deleteRun"]["run"]["state"] == "Deleted"
    listed = await gql(client, tenancy.member_token, "{ runs(all: true) { name state } }")
    assert listed["data"]["runs"] == [{"name": "llama-sft", "state": "Deleted"}]
    assert (await gql(client, tenancy.member_token, "{ runs { name } }"))["data"]["runs"] == []
    again = await gql(client, tenancy.member_token, CREATE, spec=run_spec())
    assert again["data"]["createRun"]["errors"] == []


async def test_another_workspace_can_neither_stop_nor_delete(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    await gql(client, tenancy.member_token, CREATE, spec=run_spec())
    outsiders = ((tenancy.other_token, "team-b"), (tenancy.foreign_token, "default"))
    for outsider, their_workspace in outsiders:
        for mutation, field in ((STOP, "stopRun"), (DELETE, "deleteRun")):
            answer: Any = await gql(client, outsider, mutation, name="llama-sft")
            assert answer["data"][field] == {
                "run": None,
                "errors": [
                    {
                        "code": "JOB_NOT_FOUND",
                        "field": None,
                        "message": f"No run named 'llama-sft' in workspace '{their_workspace}'.",
                    }
                ],
            }
    mine = await gql(client, tenancy.member_token, '{ run(name: "llama-sft") { state } }')
    assert mine["data"]["run"] == {"state": "Pending"}


async def test_read_a_pending_reason_machine_by_machine(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # seed L-61: the per-machine reasons of a run that does not start
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=8)
    await world.machine("gpu-08", gpus=8, pool="b")
    await world.submit(name="busy", workers=1, gpus=4, pool="b")  # half of gpu-08
    await world.schedule()
    await world.submit(name="big", workers=2, gpus=8)
    await world.schedule()
    answer = await gql(client, tenancy.member_token, REASONS, name="big")
    assert answer["data"]["run"] == {
        "state": "Pending",
        "reason": "Gang cannot be placed whole: room for 1 of 2 workers of 8 GPUs, 4 cores, 16 GiB",
        "pendingReasons": [
            {"machine": "gpu-07", "reason": "room for 1 of its 2 workers"},
            {"machine": "gpu-08", "reason": "4 of 8 GPUs free, a worker needs 8"},
        ],
    }
