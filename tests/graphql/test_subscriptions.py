"""Subscriptions in process, through the schema: who may follow what (issue 6: every root
field tried with another workspace's token). Over a real WebSocket: tests/e2e."""

from __future__ import annotations

from typing import Any

from backend.db import Database
from backend.ids import Kind
from backend.request.context import build_context
from backend.resolvers.root import schema
from tests.support import FakeClock, Tenancy
from tests.support.ids import shown
from tests.support.subscriptions import leave


async def first(db: Database, clock: FakeClock, token: str | None, query: str) -> Any:
    """The first result of a subscription (its error, when refused)."""
    authorization = f"Bearer {token}" if token else None
    context = await build_context(db, clock, authorization)
    results = await schema.subscribe(query, context_value=context)
    if not hasattr(results, "__aiter__"):
        return results  # refused before it began
    async for result in results:
        await leave(results)
        return result
    return None


async def test_another_workspace_follows_nothing(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    placed: None,
) -> None:
    follow = """subscription { followLog(worker: "llama-sft-0") { text } }"""
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        result = await first(db, clock, outsider, follow)
        assert result.errors and "No worker or run named 'llama-sft-0'" in str(result.errors)
    named = await first(
        db,
        clock,
        tenancy.other_token,
        """subscription { followLog(worker: "llama-sft-0", workspace: "default") { text } }""",
    )
    assert "No workspace named 'default'" in str(named.errors)
    anonymous = await first(db, clock, None, follow)
    assert anonymous.errors and "token" in str(anonymous.errors).lower()
    # Its own workspace: placed, but no agent holds the machine's stream in this process.
    own = await first(db, clock, tenancy.member_token, follow)
    assert "could not be fetched" in str(own.errors)


async def test_another_workspace_gets_no_events(
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    placed: None,
) -> None:
    peek = """subscription { events(organization: "default", workspace: "default") { id } }"""
    bob = await first(db, clock, tenancy.other_token, peek)
    assert "No workspace named 'default'" in str(bob.errors)
    carol = await first(db, clock, tenancy.foreign_token, peek)
    assert "No organisation named 'default'" in str(carol.errors)
    # Alice's own, from the first event on: the run she submitted.
    before_all = await shown(db, Kind.EVENT, 0)  # a cursor before the first event
    mine = await first(
        db,
        clock,
        tenancy.member_token,
        f'subscription {{ events(after: "{before_all}") {{ run }} }}',
    )
    assert mine.errors is None and mine.data == {"events": {"run": "llama-sft"}}
