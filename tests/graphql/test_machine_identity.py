"""Join tokens and machines' credentials in GraphQL: an organisation admin makes a join token,
lists credentials and revokes one (the machine is lost); no one else may, and nothing changes
when they try."""

from __future__ import annotations

import httpx
from sqlalchemy import func, select

from backend.db import Database
from backend.machine_identity import service as identity
from backend.models import JoinToken, Machine, MachineCredential
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy, local_cluster
from tests.support.api import graphql

CREATE = """mutation($e: String!, $u: Int!) { createJoinToken(expires: $e, uses: $u, name: "rack-4")
  { secret joinToken { name usesLeft expiresAt legacy } errors { code field message } } }"""
LIST = "{ machineCredentials { machine revokedAt } joinTokens { name usesLeft } }"
REVOKE = """mutation($m: String!) { revokeMachineCredential(machine: $m) {
  credentials { machine revokedAt } errors { code message } } }"""


async def count(db: Database, model: type) -> int:
    async with db.read() as session:
        return int(await session.scalar(select(func.count()).select_from(model)) or 0)


async def test_an_admin_makes_a_join_token_and_revokes_a_machines_credential(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    made = (await graphql(client, tenancy.admin_token, CREATE, e="2h", u=3))["data"]
    token = made["createJoinToken"]
    assert token["errors"] == [] and token["secret"].startswith("astj_")
    assert token["joinToken"]["name"] == "rack-4" and token["joinToken"]["usesLeft"] == 3
    assert not token["joinToken"]["legacy"]
    async with db.transaction() as session:
        await identity.join(session, clock, token["secret"], "gpu-07")
    await World(db, clock, tenancy).machine("gpu-07")

    listed = (await graphql(client, tenancy.admin_token, LIST))["data"]
    assert listed == {
        "machineCredentials": [{"machine": "gpu-07", "revokedAt": None}],
        "joinTokens": [{"name": "rack-4", "usesLeft": 2}],
    }
    revoked = (await graphql(client, tenancy.admin_token, REVOKE, m="gpu-07"))["data"]
    assert revoked["revokeMachineCredential"]["errors"] == []
    assert revoked["revokeMachineCredential"]["credentials"][0]["revokedAt"] is not None
    async with db.read() as session:
        machine = await session.scalar(select(Machine).where(Machine.name == "gpu-07"))
    assert machine is not None and machine.state == "lost"
    again = (await graphql(client, tenancy.admin_token, REVOKE, m="gpu-07"))["data"]
    assert again["revokeMachineCredential"]["errors"] == [
        {
            "code": "CREDENTIAL_NOT_FOUND",
            "message": "Machine 'gpu-07' of cluster 'local' holds no credential.",
        }
    ]


async def test_a_join_token_with_a_bad_life_is_refused_naming_the_field(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    for expires, uses, field, message in [
        ("soon", 1, "expires", "must be a duration such as 30s, 15m, 12h or 1h30m"),
        ("400d", 1, "expires", "must be a duration between 1s and 365d"),
        ("1h", 0, "uses", "must be between 1 and 10000"),
    ]:
        answer = (await graphql(client, tenancy.admin_token, CREATE, e=expires, u=uses))["data"]
        assert answer["createJoinToken"]["secret"] is None
        assert answer["createJoinToken"]["errors"] == [
            {"code": "INVALID_JOIN_TOKEN", "field": field, "message": message}
        ]
    assert await count(db, JoinToken) == 0


async def test_members_neither_make_join_tokens_nor_see_or_revoke_credentials(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    async with db.transaction() as session:
        cluster = await session.scalar(local_cluster())
        assert cluster is not None
        issued = await identity.issue_join_token(
            session, clock, organization_id=cluster.organization_id, cluster_id=cluster.id
        )
        await identity.join(session, clock, issued.secret, "gpu-07")
    for token in (tenancy.member_token, tenancy.other_token, tenancy.foreign_token):
        made = (await graphql(client, token, CREATE, e="1h", u=1))["data"]["createJoinToken"]
        assert made["secret"] is None and made["errors"][0]["code"] in ("FORBIDDEN",)
        gone = (await graphql(client, token, REVOKE, m="gpu-07"))["data"]
        assert gone["revokeMachineCredential"]["credentials"] == []
        listed = await graphql(client, token, LIST)
        assert listed.get("data") is None and "gpu-07" not in str(listed)
    assert await count(db, JoinToken) == 1
    async with db.read() as session:
        live = await session.scalar(
            select(func.count()).where(MachineCredential.revoked_at.is_(None))
        )
    assert live == 1
