"""Priority ceilings, quotas and the preemption policy through GraphQL (issue 18): organisation
admins set them; a member's run above its workspace's ceiling is refused with a field error; a
member sees only the machines its runs may use."""

from typing import Any

import httpx
from sqlalchemy import select

from backend.db import Database
from backend.machines import service as machines
from backend.models import Machine
from tests.lifecycle.world import LEASE, World
from tests.support import FakeClock, Tenancy, run_spec
from tests.support.api import CREATE, gql

CEILING = """mutation($ws: String!, $ceiling: Int!) {
  setPriorityCeiling(workspace: $ws, ceiling: $ceiling) {
    workspace { name priorityCeiling } errors { code field message }
  }
}"""
POLICY = """mutation($cluster: String!, $allow: Boolean!) {
  setPreemptionPolicy(cluster: $cluster, preemptOverQuota: $allow) {
    policy { cluster preemptOverQuota } errors { code field message }
  }
}"""


def refused(answer: Any, field: str) -> list[dict[str, Any]]:
    payload = answer["data"][field]
    assert [k for k, v in payload.items() if k != "errors" and v is not None] == []
    return payload["errors"]  # type: ignore[no-any-return]


async def test_a_run_above_the_ceiling_is_refused_with_a_field_error(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    answer = await gql(client, tenancy.other_token, CREATE, spec=run_spec(priority=51))
    assert refused(answer, "createRun") == [
        {"code": "INVALID_SPEC", "field": "priority", "message": "at most 50 in workspace team-b"}
    ]
    assert (await gql(client, tenancy.other_token, "{ runs(all: true) { name } }"))["data"] == {
        "runs": []
    }
    accepted = await gql(client, tenancy.other_token, CREATE, spec=run_spec(priority=50))
    assert accepted["data"]["createRun"]["errors"] == []


async def test_only_organisation_admins_set_a_workspaces_ceiling(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    for member in (tenancy.other_token, tenancy.member_token, tenancy.foreign_token):
        answer = await gql(client, member, CEILING, ws="team-b", ceiling=100)
        assert [e["code"] for e in refused(answer, "setPriorityCeiling")] == ["FORBIDDEN"]
    still = await gql(client, tenancy.other_token, CREATE, spec=run_spec(priority=51))
    assert refused(still, "createRun")[0]["field"] == "priority"
    bad = await gql(client, tenancy.admin_token, CEILING, ws="team-b", ceiling=101)
    assert refused(bad, "setPriorityCeiling") == [
        {"code": "INVALID_CEILING", "field": "ceiling", "message": "must be from 0 to 100"}
    ]
    raised = await gql(client, tenancy.admin_token, CEILING, ws="team-b", ceiling=70)
    assert raised["data"]["setPriorityCeiling"] == {
        "workspace": {"name": "team-b", "priorityCeiling": 70},
        "errors": [],
    }
    accepted = await gql(client, tenancy.other_token, CREATE, spec=run_spec(priority=70))
    assert accepted["data"]["createRun"]["errors"] == []
    over = await gql(client, tenancy.other_token, CREATE, spec=run_spec(name="b2", priority=71))
    assert refused(over, "createRun")[0]["message"] == "at most 70 in workspace team-b"


async def test_only_organisation_admins_set_the_preemption_policy(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    for member in (tenancy.other_token, tenancy.member_token, tenancy.foreign_token):
        answer = await gql(client, member, POLICY, cluster="local", allow=True)
        assert [e["code"] for e in refused(answer, "setPreemptionPolicy")] == ["FORBIDDEN"]
    allowed = await gql(client, tenancy.admin_token, POLICY, cluster="local", allow=True)
    assert allowed["data"]["setPreemptionPolicy"] == {
        "policy": {"cluster": "local", "preemptOverQuota": True},
        "errors": [],
    }
    missing = await gql(client, tenancy.admin_token, POLICY, cluster="nowhere", allow=True)
    assert [e["code"] for e in refused(missing, "setPreemptionPolicy")] == ["CLUSTER_NOT_FOUND"]


QUOTA = """mutation($ws: String!, $gpus: Int) {
  setQuota(workspace: $ws, cluster: "local", gpus: $gpus) {
    quota { workspace cluster gpus } errors { code field message }
  }
}"""


async def test_only_organisation_admins_set_quotas(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    for member in (tenancy.other_token, tenancy.member_token, tenancy.foreign_token):
        answer = await gql(client, member, QUOTA, ws="team-b", gpus=100)
        assert [e["code"] for e in refused(answer, "setQuota")] == ["FORBIDDEN"]
    bad = await gql(client, tenancy.admin_token, QUOTA, ws="team-b", gpus=-1)
    assert refused(bad, "setQuota") == [
        {"code": "INVALID_QUOTA", "field": "gpus", "message": "must be 0 or more"}
    ]
    for gpus in (0, 4, None):
        answer = await gql(client, tenancy.admin_token, QUOTA, ws="team-b", gpus=gpus)
        assert answer["data"]["setQuota"] == {
            "quota": {"workspace": "team-b", "cluster": "local", "gpus": gpus},
            "errors": [],
        }


async def test_members_see_neither_gpus_nor_pending_reasons_of_a_lost_machine(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=1)
    await world.machine("gpu-gone", gpus=1)
    await world.submit(tenancy.other_token, name="wide", workers=1, gpus=4)
    clock.advance(seconds=LEASE.total_seconds() + 1)
    async with db.transaction() as session:
        gpu07 = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
        assert gpu07 is not None
        await machines.heartbeat(session, clock, gpu07.id, LEASE)
        await machines.expire_leases(session, clock, LEASE)
    query = '{ gpus { machine } run(name: "wide", workspace: "team-b") '
    query += "{ pendingReasons { machine reason } } }"
    member = (await gql(client, tenancy.other_token, query))["data"]
    assert [g["machine"] for g in member["gpus"]] == ["gpu-07"]
    assert [m["machine"] for m in member["run"]["pendingReasons"]] == ["gpu-07"]
    admin = (await gql(client, tenancy.admin_token, query))["data"]
    assert [g["machine"] for g in admin["gpus"]] == ["gpu-07", "gpu-gone"]
    assert admin["run"]["pendingReasons"] == [
        {"machine": "gpu-07", "reason": "1 of 1 GPU free, a worker needs 4"},
        {"machine": "gpu-gone", "reason": "lost: its lease expired"},
    ]
