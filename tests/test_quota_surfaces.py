"""Issue 21: a workspace's quota and a cluster's alert thresholds read back in GraphQL, each
tried with a token of another workspace and of another organisation (seed L-62: "Waits for
namespace quota" names a quota its workspace can now read)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support import Tenancy
from tests.support.api import graphql

SET_QUOTA = """mutation($w: String!, $g: Int) { setQuota(workspace: $w, cluster: "local",
  gpus: $g) { quota { workspace cluster gpus } errors { code field message } } }"""
QUOTA = """query($w: String) {
  quota(cluster: "local", workspace: $w) { workspace cluster gpus } }"""
THRESHOLD = """mutation($n: String!, $v: Float!) { setThreshold(cluster: "local", name: $n,
  value: $v) { threshold { name value } errors { code field message } } }"""
THRESHOLDS = """{ thresholds(cluster: "local") { name value default updatedAt } }"""


def refused(answer: dict[str, Any]) -> str:
    """The refusal's code and message: "FORBIDDEN: Members read …"."""
    assert answer.get("data") is None, answer
    error = answer["errors"][0]
    return f"{error['extensions']['code']}: {error['message']}"


async def test_members_read_their_own_workspaces_quota_admins_any(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    # seed L-62
    set_a = await graphql(client, tenancy.admin_token, SET_QUOTA, w="default", g=4)
    assert set_a["data"]["setQuota"]["errors"] == []
    set_b = await graphql(client, tenancy.admin_token, SET_QUOTA, w="team-b", g=2)
    assert set_b["data"]["setQuota"]["errors"] == []

    own = await graphql(client, tenancy.member_token, QUOTA)
    assert own["data"]["quota"] == {"workspace": "default", "cluster": "local", "gpus": 4}
    named = await graphql(client, tenancy.member_token, QUOTA, w="default")
    assert named["data"]["quota"]["gpus"] == 4
    theirs = await graphql(client, tenancy.other_token, QUOTA)
    assert theirs["data"]["quota"] == {"workspace": "team-b", "cluster": "local", "gpus": 2}
    admin = await graphql(client, tenancy.admin_token, QUOTA, w="team-b")
    assert admin["data"]["quota"]["gpus"] == 2

    # Another workspace's member does not read default's; nor does a member read team-b's.
    forbidden = (
        "FORBIDDEN: Members read their own workspace's quota; only the organisation's admins "
        "read another workspace's."
    )
    assert refused(await graphql(client, tenancy.other_token, QUOTA, w="default")) == forbidden
    assert refused(await graphql(client, tenancy.member_token, QUOTA, w="team-b")) == forbidden
    # Another organisation's token reads its own organisation's 'default', which has no quota,
    # and is refused team-b's, as a member of any other workspace is.
    foreign = await graphql(client, tenancy.foreign_token, QUOTA)
    assert foreign["data"]["quota"] == {"workspace": "default", "cluster": "local", "gpus": None}
    assert refused(await graphql(client, tenancy.foreign_token, QUOTA, w="team-b")).startswith(
        "FORBIDDEN: "
    )

    # Lifted: read back as no quota.
    lifted = await graphql(client, tenancy.admin_token, SET_QUOTA, w="default", g=None)
    assert lifted["data"]["setQuota"]["quota"]["gpus"] is None
    assert (await graphql(client, tenancy.member_token, QUOTA))["data"]["quota"]["gpus"] is None


async def test_quota_writes_are_the_admins_of_its_organisation(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    for token in (tenancy.member_token, tenancy.other_token, tenancy.foreign_token):
        answer = await graphql(client, token, SET_QUOTA, w="default", g=1)
        assert answer["data"]["setQuota"]["errors"][0]["code"] == "FORBIDDEN"
    bad = await graphql(client, tenancy.admin_token, SET_QUOTA, w="default", g=-1)
    assert bad["data"]["setQuota"]["errors"][0]["field"] == "gpus"
    nowhere = QUOTA.replace('"local"', '"nowhere"')
    assert refused(await graphql(client, tenancy.admin_token, nowhere, w="default")) == (
        "CLUSTER_NOT_FOUND: No cluster named 'nowhere'."
    )
    assert refused(await graphql(client, tenancy.admin_token, QUOTA, w="nobody")).startswith(
        "WORKSPACE_NOT_FOUND: "
    )
    assert (await graphql(client, tenancy.member_token, QUOTA))["data"]["quota"]["gpus"] is None


async def test_admins_read_back_the_clusters_thresholds(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    before = (await graphql(client, tenancy.admin_token, THRESHOLDS))["data"]["thresholds"]
    assert {t["name"]: (t["value"], t["updatedAt"]) for t in before} == {
        "goodput_drop.below": (0.5, None),
        "goodput_drop.points": (0.2, None),
        "goodput_drop.min_held_gpu_hours": (1.0, None),
        "workers_stalled": (1.0, None),
        "runs_with_straggler": (1.0, None),
        "gpu_faults": (1.0, None),
        "slurm_import_lag": (300.0, None),  # seconds (issue 38 F3)
    }
    ok = await graphql(client, tenancy.admin_token, THRESHOLD, n="workers_stalled", v=3)
    assert ok["data"]["setThreshold"]["errors"] == []
    after = (await graphql(client, tenancy.admin_token, THRESHOLDS))["data"]["thresholds"]
    stalled = next(t for t in after if t["name"] == "workers_stalled")
    assert stalled["value"] == 3 and stalled["default"] == 1 and stalled["updatedAt"]
    # Members, another workspace's, another organisation's: refused, reading and writing.
    for token in (tenancy.member_token, tenancy.other_token, tenancy.foreign_token):
        assert refused(await graphql(client, token, THRESHOLDS)) == (
            "FORBIDDEN: Only the organisation's admins read a cluster's alert thresholds."
        )
        write = (await graphql(client, token, THRESHOLD, n="workers_stalled", v=9))["data"]
        assert write["setThreshold"]["threshold"] is None and write["setThreshold"]["errors"]
    again = (await graphql(client, tenancy.admin_token, THRESHOLDS))["data"]["thresholds"]
    assert next(t for t in again if t["name"] == "workers_stalled")["value"] == 3


QUOTAS = """{ quotas(cluster: "local") { workspace cluster gpus } }"""


async def test_admins_list_every_workspaces_quota_on_a_cluster(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    # seed L-62: what the console's Machines page shows its admins
    assert (await graphql(client, tenancy.admin_token, QUOTAS))["data"]["quotas"] == []
    await graphql(client, tenancy.admin_token, SET_QUOTA, w="team-b", g=2)
    await graphql(client, tenancy.admin_token, SET_QUOTA, w="default", g=8)
    assert (await graphql(client, tenancy.admin_token, QUOTAS))["data"]["quotas"] == [
        {"workspace": "default", "cluster": "local", "gpus": 8},
        {"workspace": "team-b", "cluster": "local", "gpus": 2},
    ]
    for token in (tenancy.member_token, tenancy.other_token, tenancy.foreign_token):
        assert refused(await graphql(client, token, QUOTAS)) == (
            "FORBIDDEN: Only the organisation's admins read every workspace's quota."
        )
