"""Issue 37 N8: the ids the API shows count nothing of another workspace.

They were the database's numbers, one sequence per table for every workspace together: Bob
(team-b) submitted a run, Alice (default) five, Bob another, and Bob's second run id was his
first plus six: he had counted Alice's runs (and her workers, her events, her webhooks, every
user's tokens). Now each is an opaque id (backend/ids.py); the attack reads nothing, the ids stay
the same from one request to the next, and what the API is given back is opened with the
install's key: a number, another kind's id or one made up is no id.
"""

from __future__ import annotations

import base64

import httpx

from backend import ids
from backend.db import Database
from backend.ids import SHOWN_LENGTH, Kind
from tests.support import Tenancy
from tests.support.api import gql
from tests.support.ids import opened, shown

SUBMIT = """mutation($s: JSON!) {
  createRun(spec: $s) { run { id workers { id } } errors { message } }
}"""
RUN = "query($name: String!) { run(name: $name) { id workers { id } } }"
EVENTS = "query($before: ID) { events(limit: 3, before: $before) { events { id } nextBefore } }"
HOOK = """mutation($url: String!) {
  createWebhook(url: $url) { webhook { id } errors { code } }
}"""
DELETE = "mutation($id: ID!) { deleteWebhook(id: $id) { webhook { id } errors { code } } }"
TOKENS = "{ tokens { id user } }"
REVOKE = "mutation($t: String!) { revokeToken(token: $t) { token { id } errors { code message } } }"


async def submit(client: httpx.AsyncClient, token: str, name: str) -> tuple[str, str]:
    spec = {"name": name, "gpus": 0, "command": ["true"]}
    answer = (await gql(client, token, SUBMIT, s=spec))["data"]["createRun"]
    assert answer["errors"] == [], answer
    return answer["run"]["id"], answer["run"]["workers"][0]["id"]


def counted_between(first: str, second: str) -> int | None:
    """The attack: how many were made between two of one's own ids (None: they say nothing)."""
    if first.isdigit() and second.isdigit():
        return int(second) - int(first) - 1
    return None


def opaque(shown_id: str) -> bool:
    """22 characters of base64url, no number in sight."""
    return (
        len(shown_id) == SHOWN_LENGTH
        and len(base64.urlsafe_b64decode(shown_id + "==")) == 16
        and not shown_id.isdigit()
    )


async def test_a_workspaces_run_and_worker_ids_count_nothing_of_anothers(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    bob, alice = tenancy.other_token, tenancy.member_token
    b1 = await submit(client, bob, "b1")
    for i in range(5):
        await submit(client, alice, f"a{i}")
    b2 = await submit(client, bob, "b2")
    # before: 5 runs and 5 workers of Alice's between Bob's two
    assert counted_between(b1[0], b2[0]) is None
    assert counted_between(b1[1], b2[1]) is None
    assert all(opaque(i) for i in (*b1, *b2))
    # the same ids when asked again; behind them, the rows they name
    again = (await gql(client, bob, RUN, name="b2"))["data"]["run"]
    assert (again["id"], again["workers"][0]["id"]) == b2
    assert opened(Kind.RUN, b2[0]) - opened(Kind.RUN, b1[0]) == 6
    # kinds are apart: a run's id opens as no worker's, though a worker has its number
    codec = await ids.codec(db)
    assert codec.open(Kind.WORKER, b2[0]) is None
    assert await shown(db, Kind.WORKER, opened(Kind.RUN, b2[0])) != b2[0]


async def test_event_ids_count_nothing_and_only_the_apis_own_page_on(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    bob, alice = tenancy.other_token, tenancy.member_token
    await submit(client, bob, "b1")
    for i in range(3):
        await submit(client, alice, f"a{i}")
    await submit(client, bob, "b2")
    page = (await gql(client, bob, EVENTS))["data"]["events"]
    ids = [e["id"] for e in page["events"]]
    assert len(ids) == 3 and all(opaque(i) for i in ids)
    assert counted_between(ids[-1], ids[0]) is None
    # the REST shim shows the same ids, and pages on with them
    rest = await client.get(
        "/v1/orgs/default/workspaces/team-b/events",
        params={"limit": "3"},
        headers={"Authorization": f"Bearer {bob}"},
    )
    assert [e["id"] for e in rest.json()["events"]] == ids
    assert rest.json()["next_before"] == page["nextBefore"]
    following = (await gql(client, bob, EVENTS, before=page["nextBefore"]))["data"]["events"]
    assert following["events"] and not set(ids) & {e["id"] for e in following["events"]}
    # a number (what before took), a run's id, one made up: no event id
    run_id = (await gql(client, bob, RUN, name="b2"))["data"]["run"]["id"]
    for forged in (str(opened(Kind.EVENT, ids[0])), run_id, "A" * SHOWN_LENGTH):
        refused = await gql(client, bob, EVENTS, before=forged)
        assert refused["data"] is None
        assert "before: must be an event id as the API gave it" in refused["errors"][0]["message"]


async def test_webhook_and_token_ids_count_nothing_and_numbers_name_none(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    bob, alice = tenancy.other_token, tenancy.member_token
    first = (await gql(client, bob, HOOK, url="https://hooks.example.com/1"))["data"]
    alices = (await gql(client, alice, HOOK, url="https://hooks.example.com/a"))["data"]
    second = (await gql(client, bob, HOOK, url="https://hooks.example.com/2"))["data"]
    ids = [h["createWebhook"]["webhook"]["id"] for h in (first, alices, second)]
    assert all(opaque(i) for i in ids) and counted_between(ids[0], ids[2]) is None
    # Alice's webhook by its number, or by its id, is none of Bob's
    for forged in (str(opened(Kind.WEBHOOK, ids[1])), ids[1]):
        answer = (await gql(client, bob, DELETE, id=forged))["data"]["deleteWebhook"]
        assert answer == {"webhook": None, "errors": [{"code": "WEBHOOK_NOT_FOUND"}]}
    # tokens: Bob sees his own, its id opaque; the number behind it names no token
    (own,) = (await gql(client, bob, TOKENS))["data"]["tokens"]
    assert opaque(own["id"])
    number = str(opened(Kind.TOKEN, own["id"]))
    answer = (await gql(client, bob, REVOKE, t=number))["data"]["revokeToken"]
    assert answer == {
        "token": None,
        "errors": [{"code": "TOKEN_NOT_FOUND", "message": f"No token '{number}'."}],
    }
    assert (await gql(client, bob, REVOKE, t=own["id"]))["data"]["revokeToken"] == {
        "token": {"id": own["id"]},
        "errors": [],
    }
