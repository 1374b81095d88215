"""Webhooks through GraphQL: created with their secret shown once, listed with their latest
deliveries and never their secret, deleted; kept in their workspace; bad URLs refused, and
addresses inside unless the admin's allow-list names them (the receivers here are on
loopback, which these tests' server allows)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import event, select

from backend.config import Settings, parse_networks
from backend.db import Database
from backend.ids import Kind
from backend.models import Event, Webhook, Workspace
from backend.webhooks import service as webhooks
from tests.support import FakeClock, Tenancy, row_counts, server_settings
from tests.support.api import gql
from tests.support.ids import opened, shown
from tests.webhooks.receiver import receiving

WEBHOOK = "id url kinds createdAt"
CREATE = f"""mutation($url: String!, $kinds: [String!], $workspace: String) {{
  createWebhook(url: $url, kinds: $kinds, workspace: $workspace) {{
    webhook {{ {WEBHOOK} }} secret errors {{ code field message }}
  }}
}}"""
DELETE = """mutation($id: ID!, $workspace: String) {
  deleteWebhook(id: $id, workspace: $workspace) {
    webhook { id url } errors { code field message }
  }
}"""
DELIVERIES = "deliveries { eventId kind status attempts nextAttemptAt deliveredAt gaveUpAt lastStatus lastError }"  # noqa: E501
LIST = (
    f"query($workspace: String) {{ webhooks(workspace: $workspace) {{ {WEBHOOK} {DELIVERIES} }} }}"
)
URL = "https://hooks.example.com/astraeus"


@pytest.fixture
def settings(database_url: str, tmp_path: Any) -> Settings:
    """A server whose admin allows webhooks to loopback (where the receivers are)."""
    allow = parse_networks("127.0.0.0/8")
    return server_settings(database_url, tmp_path).model_copy(update={"webhook_allow": allow})


async def create(client: httpx.AsyncClient, token: str, **variables: Any) -> Any:
    answer = await gql(client, token, CREATE, **({"url": URL} | variables))
    return answer["data"]["createWebhook"]


async def add_event(db: Database, clock: FakeClock, kind: str = "run.state") -> int:
    async with db.transaction() as session:
        ws = await session.scalar(select(Workspace).where(Workspace.name == "default"))
        assert ws is not None
        row = Event(
            organization_id=ws.organization_id,
            workspace_id=ws.id,
            kind=kind,
            reason="something happened",
            data={},
            created_at=clock.now(),
        )
        session.add(row)
        await session.flush()
        return row.id


async def deliver(db: Database, clock: FakeClock, settings: Settings) -> None:
    """One pass of the webhooks.deliver actor, step by step through the service: each
    webhook's first due delivery sent."""
    async with db.transaction() as session:
        await webhooks.hand_out(session, clock)
    async with db.transaction() as session:
        due = await webhooks.claim_due(session, clock, room=64)
    async with webhooks.sending(settings, clock) as sender:
        for delivery in due:
            sent = await sender.send(delivery)
            async with db.transaction() as session:
                await webhooks.record(session, clock, sent)


async def test_the_secret_is_shown_once_and_deliveries_are_listed(
    client: httpx.AsyncClient,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    settings: Settings,
) -> None:
    with receiving() as receiver:
        receiver.statuses = [204, 500]
        created = await create(client, tenancy.member_token, url=receiver.url, kinds=["run"])
        assert created["errors"] == []
        secret = created["secret"]
        assert secret.startswith("whsec_") and len(secret) > 40
        hook = created["webhook"]
        assert hook == {
            "id": hook["id"],
            "url": receiver.url,
            "kinds": ["run"],
            "createdAt": "2026-10-01T01:02:11.402117+00:00",
        }
        delivered = await add_event(db, clock)
        await deliver(db, clock, settings)
        clock.advance(seconds=5)
        failed = await add_event(db, clock, "run.created")
        await add_event(db, clock, "worker.state")  # not a kind it wants
        await deliver(db, clock, settings)
    listed = await gql(client, tenancy.member_token, LIST)
    assert listed["data"]["webhooks"] == [
        hook
        | {
            "deliveries": [
                {
                    "eventId": await shown(db, Kind.EVENT, failed),
                    "kind": "run.created",
                    "status": "RETRYING",
                    "attempts": 1,
                    "nextAttemptAt": "2026-10-01T01:02:26.402117+00:00",
                    "deliveredAt": None,
                    "gaveUpAt": None,
                    "lastStatus": 500,
                    "lastError": "failed: HTTP 500",
                },
                {
                    "eventId": await shown(db, Kind.EVENT, delivered),
                    "kind": "run.state",
                    "status": "DELIVERED",
                    "attempts": 0,
                    "nextAttemptAt": None,
                    "deliveredAt": "2026-10-01T01:02:11.402117+00:00",
                    "gaveUpAt": None,
                    "lastStatus": 204,
                    "lastError": None,
                },
            ]
        }
    ]
    assert secret not in str(listed)
    introspected = await gql(
        client, tenancy.member_token, '{ __type(name: "Webhook") { fields { name } } }'
    )
    assert "secret" not in {f["name"] for f in introspected["data"]["__type"]["fields"]}


async def test_bad_urls_and_kinds_are_refused_naming_the_field(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    before = await row_counts(db)
    refused = await create(client, tenancy.member_token, url="ftp://example.com/x")
    assert refused == {
        "webhook": None,
        "secret": None,
        "errors": [
            {
                "code": "INVALID_WEBHOOK",
                "field": "url",
                "message": "must be an http:// or https:// URL",
            }
        ],
    }
    for url, message in [
        ("https://", "must name a host"),
        ("not a url", "must not contain spaces or control characters"),
        ("https://example.com/" + "x" * 2030, "must be at most 2048 characters"),
    ]:
        answer = await create(client, tenancy.member_token, url=url)
        assert answer["errors"] == [{"code": "INVALID_WEBHOOK", "field": "url", "message": message}]
    kinds = await create(client, tenancy.member_token, kinds=["alert", "Run State"])
    assert [(e["field"], e["code"]) for e in kinds["errors"]] == [("kinds[1]", "INVALID_WEBHOOK")]
    assert await row_counts(db) == before


async def test_another_workspace_sees_none_and_cannot_delete(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    hook = (await create(client, tenancy.member_token))["webhook"]
    before = await row_counts(db)
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        assert (await gql(client, outsider, LIST))["data"]["webhooks"] == []
        named = await gql(client, outsider, LIST, workspace="default")
        assert named["data"]["webhooks"] == []
        deleted = await gql(client, outsider, DELETE, id=hook["id"])
        assert deleted["data"]["deleteWebhook"]["webhook"] is None
        assert [e["code"] for e in deleted["data"]["deleteWebhook"]["errors"]] == [
            "WEBHOOK_NOT_FOUND"
        ]
        named_delete = await gql(client, outsider, DELETE, id=hook["id"], workspace="default")
        errors = named_delete["data"]["deleteWebhook"]["errors"]
        # Bob may not name 'default'; Carol's 'default' is her own, which has no such webhook.
        expected = "WORKSPACE_NOT_FOUND" if outsider == tenancy.other_token else "WEBHOOK_NOT_FOUND"
        assert [e["code"] for e in errors] == [expected]
        assert hook["url"] not in str(named_delete) + str(deleted) + str(named)
    assert await row_counts(db) == before
    async with db.read() as session:
        row = await session.get(Webhook, opened(Kind.WEBHOOK, hook["id"]))
        assert row is not None and row.disabled_at is None


async def test_an_org_admin_names_a_workspace_and_a_deleted_webhook_is_gone(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    created = await create(client, tenancy.admin_token, workspace="team-b", kinds=["alert"])
    assert created["errors"] == []
    hook = created["webhook"]
    seen = await gql(client, tenancy.other_token, LIST)
    assert [w["id"] for w in seen["data"]["webhooks"]] == [hook["id"]]
    assert (await gql(client, tenancy.member_token, LIST))["data"]["webhooks"] == []
    deleted = await gql(client, tenancy.other_token, DELETE, id=hook["id"])
    assert deleted["data"]["deleteWebhook"] == {
        "webhook": {"id": hook["id"], "url": URL},
        "errors": [],
    }
    assert (await gql(client, tenancy.admin_token, LIST, workspace="team-b"))["data"] == {
        "webhooks": []
    }
    again = await gql(client, tenancy.other_token, DELETE, id=hook["id"])
    assert [e["code"] for e in again["data"]["deleteWebhook"]["errors"]] == ["WEBHOOK_NOT_FOUND"]
    bad_id = await gql(client, tenancy.other_token, DELETE, id="webhook-1")
    assert [e["code"] for e in bad_id["data"]["deleteWebhook"]["errors"]] == ["WEBHOOK_NOT_FOUND"]


async def test_webhooks_with_deliveries_take_a_fixed_number_of_statements(
    client: httpx.AsyncClient,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    settings: Settings,
) -> None:
    async def selects() -> int:
        seen: list[str] = []

        def count(*args: Any) -> None:
            seen.append(args[2])

        event.listen(db.engine.sync_engine, "before_cursor_execute", count)
        try:
            answer = await gql(client, tenancy.member_token, LIST)
        finally:
            event.remove(db.engine.sync_engine, "before_cursor_execute", count)
        assert "errors" not in answer
        return len([s for s in seen if s.lstrip().upper().startswith("SELECT")])

    with receiving() as receiver:
        await create(client, tenancy.member_token, url=receiver.url)
        await add_event(db, clock)
        await deliver(db, clock, settings)
        one = await selects()
        for _ in range(4):
            await create(client, tenancy.member_token, url=receiver.url)
        for _ in range(3):
            await add_event(db, clock)
        await deliver(db, clock, settings)
    assert await selects() == one


async def test_addresses_inside_are_refused_naming_the_field_unless_allowed(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    # this server's admin allows loopback (127.0.0.0/8), not its own port (8080) nor the rest
    before = await row_counts(db)
    for url in (
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:5432/",
        "http://10.0.0.5/hook",
        "http://0x0a000005/hook",
        "http://[fd00::1]/",
        "http://127.0.0.1:8080/graphql",
        "http://localhost:8080/",
    ):
        answer = await create(client, tenancy.member_token, url=url)
        assert answer == {
            "webhook": None,
            "secret": None,
            "errors": [
                {
                    "code": "INVALID_WEBHOOK",
                    "field": "url",
                    "message": "refused: private address (loopback, link-local and private "
                    "ones only if allowed)",
                }
            ],
        }, url
    assert await row_counts(db) == before
    allowed = await create(client, tenancy.member_token, url="http://127.0.0.1:9000/hook")
    assert allowed["errors"] == []
