"""Tokens through GraphQL: `tokens` lists a member's own and an admin's organisation's, never a
secret; `revokeToken` revokes what the caller may see, and refuses the rest unchanged."""

from __future__ import annotations

import httpx

from tests.support import FakeClock, Tenancy
from tests.support.api import gql

TOKENS = "{ tokens { id prefix user workspace revokedAt } }"
REVOKE = """mutation($t: String!) {
  revokeToken(token: $t) { token { user revokedAt } errors { code message } }
}"""


async def test_tokens_lists_a_members_own_and_an_admins_organisations(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    mine = (await gql(client, tenancy.member_token, TOKENS))["data"]["tokens"]
    assert [(t["user"], t["workspace"], t["prefix"]) for t in mine] == [
        ("alice", "default", tenancy.member_token[:12])
    ]
    everyone = (await gql(client, tenancy.admin_token, TOKENS))["data"]["tokens"]
    assert [(t["user"], t["workspace"]) for t in everyone] == [
        ("admin", "default"),
        ("alice", "default"),
        ("bob", "team-b"),
    ]
    secrets = (tenancy.admin_token, tenancy.member_token, tenancy.other_token)
    assert not any(s in str(everyone) for s in secrets)


async def test_revoke_token_refuses_anothers_then_revokes_ones_own(
    client: httpx.AsyncClient, clock: FakeClock, tenancy: Tenancy
) -> None:
    everyone = (await gql(client, tenancy.admin_token, TOKENS))["data"]["tokens"]
    bobs = next(t for t in everyone if t["user"] == "bob")
    refused = await gql(client, tenancy.member_token, REVOKE, t=str(bobs["id"]))
    assert refused["data"]["revokeToken"] == {
        "token": None,
        "errors": [{"code": "TOKEN_NOT_FOUND", "message": f"No token '{bobs['id']}'."}],
    }
    still = (await gql(client, tenancy.other_token, TOKENS))["data"]["tokens"]
    assert [t["revokedAt"] for t in still] == [None]

    done = await gql(client, tenancy.member_token, REVOKE, t=tenancy.member_token[:12])
    assert done["data"]["revokeToken"] == {
        "token": {"user": "alice", "revokedAt": clock.now().isoformat()},
        "errors": [],
    }
    after = await gql(client, tenancy.member_token, TOKENS)
    assert after["data"] is None
    assert after["errors"][0]["message"].startswith("A valid API token is required")
