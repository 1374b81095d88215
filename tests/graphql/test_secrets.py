"""Secrets through GraphQL: set or declared, listed without values, kept in their workspace;
a run naming an unknown secret is refused; only the machine running a worker gets values."""

from typing import Any

import httpx
from sqlalchemy import select

from backend.db import Database
from backend.models import Machine, Worker
from backend.secrets import service as secrets
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy, row_counts, run_spec
from tests.support.api import CREATE, gql

SET = """mutation($name: String!, $value: String, $workspace: String) {
  setSecret(name: $name, value: $value, workspace: $workspace) {
    secret { name external isSet } errors { code field message }
  }
}"""
LIST = "query($workspace: String) { secrets(workspace: $workspace) { name external isSet } }"
CREDENTIALS = [{"secret": "hf-token", "env": "HF_TOKEN"}]


async def test_a_secret_is_listed_by_name_and_never_by_value(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    set_ = await gql(client, tenancy.member_token, SET, name="hf-token", value="hf_abc")
    assert set_["data"]["setSecret"] == {
        "secret": {"name": "hf-token", "external": False, "isSet": True},
        "errors": [],
    }
    declared = await gql(client, tenancy.member_token, SET, name="wandb-key")
    assert declared["data"]["setSecret"]["secret"] == {
        "name": "wandb-key",
        "external": True,
        "isSet": False,
    }
    listed = await gql(client, tenancy.member_token, LIST)
    assert listed["data"]["secrets"] == [
        {"name": "hf-token", "external": False, "isSet": True},
        {"name": "wandb-key", "external": True, "isSet": False},
    ]
    assert "hf_abc" not in str(listed) + str(set_)
    introspected = await gql(
        client, tenancy.member_token, '{ __type(name: "Secret") { fields { name } } }'
    )
    assert "value" not in {f["name"] for f in introspected["data"]["__type"]["fields"]}


async def test_bad_names_and_other_workspaces_are_refused(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    before = await row_counts(db)
    bad = await gql(client, tenancy.member_token, SET, name="Not_A_Name", value="x")
    assert bad["data"]["setSecret"]["errors"] == [
        {
            "code": "INVALID_SECRET",
            "field": "name",
            "message": "must be lowercase letters, digits and '-', starting and ending with a "
            "letter or digit, at most 63 characters",
        }
    ]
    await gql(client, tenancy.member_token, SET, name="hf-token", value="hf_abc")
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        assert (await gql(client, outsider, LIST))["data"]["secrets"] == []
        named = await gql(client, outsider, SET, name="hf-token", value="x", workspace="default")
        errors = named["data"]["setSecret"]["errors"]
        if outsider == tenancy.other_token:
            assert errors[0]["code"] == "WORKSPACE_NOT_FOUND"
        else:  # the other organisation's own 'default' workspace: its own secret, not ours
            assert errors == []
    assert (await row_counts(db))["secrets"] == before["secrets"] + 2


async def test_a_run_naming_an_unknown_secret_is_refused_and_writes_nothing(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    before = await row_counts(db)
    spec = run_spec(credentials=[*CREDENTIALS, {"secret": "other", "file": "o.txt"}])
    answer = await gql(client, tenancy.member_token, CREATE, spec=spec)
    assert answer["data"]["createRun"]["errors"] == [
        {
            "code": "INVALID_SPEC",
            "field": "credentials[0].secret",
            "message": "no secret named 'hf-token' in this workspace",
        },
        {
            "code": "INVALID_SPEC",
            "field": "credentials[1].secret",
            "message": "no secret named 'other' in this workspace",
        },
    ]
    assert await row_counts(db) == before


async def test_only_the_machine_running_the_worker_gets_the_values(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    await gql(client, tenancy.member_token, SET, name="hf-token", value="hf_abc")
    world = World(db, clock, tenancy)
    for name in ("gpu-01", "gpu-02"):
        await world.machine(name, gpus=8)
    await world.submit(workers=1, gpus=8, credentials=CREDENTIALS)
    await world.schedule()
    async with db.read() as session:
        machines = list(await session.scalars(select(Machine).order_by(Machine.id)))
        worker = await session.scalar(select(Worker).where(Worker.name == "llama-sft-0"))
        assert worker is not None
        answers: list[Any] = [
            await secrets.values_for_worker(session, m.id, worker.id, worker.attempt)
            for m in machines
        ]
        # issue 17: the machine running it, asking for another attempt, gets nothing either
        stale = await secrets.values_for_worker(
            session, worker.machine_id or 0, worker.id, worker.attempt - 1
        )
    placed = [a for a in answers if a is not None]
    assert len(placed) == 1 and placed[0].values == {"hf-token": "hf_abc"}
    assert placed[0].missing == []
    assert stale is None
