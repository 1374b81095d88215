"""Issue 21: a period of exactly 400 days, a member told a cluster's goodput needs an admin,
and a time the endpoint cannot read named with the forms it accepts (seed G-32, G-34)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests.support import FakeClock, Tenancy

CLUSTER = "/v1/organizations/default/clusters/local/goodput"
THRESHOLD = """mutation { setThreshold(cluster: "local", name: "gpu_faults", value: 3)
  { threshold { name } errors { code message } } }"""


async def get(client: httpx.AsyncClient, token: str, path: str, **params: Any) -> httpx.Response:
    return await client.get(path, params=params, headers={"Authorization": f"Bearer {token}"})


@pytest.mark.parametrize("form", ["rfc3339", "unix"])
async def test_a_period_of_exactly_400_days_is_accepted(
    client: httpx.AsyncClient, clock: FakeClock, tenancy: Tenancy, form: str
) -> None:
    # seed G-32: a period is at most 400 days; `start` 400 days ago and `end` defaulted to
    # now is 400 days (it answered 'a period is at most 400 days': the end rounded up an hour)
    start = clock.now() - timedelta(days=400)
    raw = start.isoformat() if form == "rfc3339" else str(int(start.timestamp()))
    answer = await get(client, tenancy.member_token, "/v1/goodput", start=raw)
    assert answer.status_code == 200, answer.text
    longer = start - timedelta(hours=1)
    over = await get(client, tenancy.member_token, "/v1/goodput", start=longer.isoformat())
    assert over.status_code == 400
    assert over.json()["errors"] == [{"field": "start", "reason": "a period is at most 400 days"}]


async def test_a_member_is_told_a_clusters_goodput_needs_an_admin(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    # seed G-34: the admins' route; a member of the organisation is refused, not told the
    # cluster does not exist
    for member in (tenancy.member_token, tenancy.other_token):
        refused = await get(client, member, CLUSTER)
        assert refused.status_code == 403, refused.text
        body = refused.json()
        assert body["code"] == "FORBIDDEN" and "organisation admin" in body["message"]
    # another organisation's cluster stays unnamed: 404
    foreign = await get(client, tenancy.foreign_token, CLUSTER)
    assert foreign.status_code == 404 and foreign.json()["code"] == "CLUSTER_NOT_FOUND"
    unknown = await get(
        client, tenancy.member_token, "/v1/organizations/default/clusters/nope/goodput"
    )
    assert unknown.status_code == 404
    assert (await get(client, tenancy.admin_token, CLUSTER)).status_code == 200


async def graphql(client: httpx.AsyncClient, token: str, query: str) -> dict[str, Any]:
    answer = await client.post(
        "/graphql", json={"query": query}, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["data"]["setThreshold"])


async def test_a_member_setting_a_threshold_is_told_it_needs_an_admin(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    # seed G-45: a cluster's operators set its thresholds
    refused = await graphql(client, tenancy.member_token, THRESHOLD)
    assert refused["threshold"] is None
    assert refused["errors"][0]["code"] == "FORBIDDEN"
    assert "organisation admin" in refused["errors"][0]["message"]
    # the mutation names a cluster of the caller's own organisation: one it has not is unknown
    unknown = await graphql(client, tenancy.member_token, THRESHOLD.replace('"local"', '"nope"'))
    assert unknown["errors"][0]["code"] == "CLUSTER_NOT_FOUND"
    done = await graphql(client, tenancy.admin_token, THRESHOLD)
    assert done == {"threshold": {"name": "gpu_faults"}, "errors": []}


@pytest.mark.parametrize("path", ["/v1/goodput", "/v1/goodput/intervals", CLUSTER])
async def test_a_time_it_cannot_read_is_named_with_the_forms_accepted(
    client: httpx.AsyncClient, tenancy: Tenancy, path: str
) -> None:
    # seed G-32; the forms of the metrics range's (README "Metrics over time")
    answer = await get(client, tenancy.admin_token, path, start="garbage")
    assert answer.status_code == 400, answer.text
    assert answer.json()["errors"] == [
        {
            "field": "start",
            "reason": "must be Unix seconds, Unix milliseconds or an RFC 3339 time",
        }
    ]
    assert "isoformat" not in answer.text
