"""User tokens expire, are listed and revoked, each by whom may see them; open streams end with
their token."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import select
from starlette.applications import Starlette

from backend.access import service as access
from backend.access.rules import hash_token
from backend.access.watch import TokenWatch
from backend.db import Database
from backend.errors import Conflict, NotFound, Unauthenticated
from backend.models import ApiToken
from backend.organizations import service as organizations
from tests.support import FakeClock, Tenancy


async def _issue(
    db: Database, clock: FakeClock, user: str, workspace: str, expires_in: timedelta | None
) -> str:
    async with db.transaction() as session:
        org = await organizations.organization_by_name(session, "default")
        ws = await organizations.workspace_by_name(session, org.id, workspace)
        row = await access.ensure_user(
            session, clock, name=user, organization_id=org.id, workspace_id=ws.id, org_admin=False
        )
        issued = await access.issue_user_token(
            session,
            clock,
            user=row,
            organization_id=org.id,
            workspace_id=ws.id,
            name="ci",
            expires_in=expires_in,
        )
        return issued.secret


async def _authenticate(db: Database, secret: str, clock: FakeClock) -> str:
    async with db.read() as session:
        return (await access.authenticate(session, secret, clock.now())).user_name


async def test_a_token_is_good_until_it_expires_then_refused_as_expired(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    secret = await _issue(db, clock, "alice", "default", timedelta(days=30))
    async with db.read() as session:
        stored = await session.scalar(
            select(ApiToken.expires_at).where(ApiToken.token_hash == hash_token(secret))
        )
    assert stored == clock.now() + timedelta(days=30)
    clock.advance(days=30, seconds=-1)
    assert await _authenticate(db, secret, clock) == "alice"
    clock.advance(seconds=1)
    with pytest.raises(Unauthenticated) as refused:
        await _authenticate(db, secret, clock)
    assert refused.value.message == "The API token has expired."
    # a token without an expiry is still good
    assert await _authenticate(db, tenancy.member_token, clock) == "alice"


async def _principal(db: Database, secret: str, clock: FakeClock) -> access.Principal:
    async with db.read() as session:
        return await access.authenticate(session, secret, clock.now())


async def test_a_member_lists_its_own_tokens_an_admin_every_token_of_its_organisation(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    await _issue(db, clock, "alice", "default", None)
    member = await _principal(db, tenancy.member_token, clock)
    admin = await _principal(db, tenancy.admin_token, clock)
    foreign = await _principal(db, tenancy.foreign_token, clock)
    async with db.read() as session:
        mine = await access.list_tokens(session, member)
        everyone = await access.list_tokens(session, admin)
        theirs = await access.list_tokens(session, foreign)
    assert [(t.user_name, t.workspace_name) for t in mine] == [("alice", "default")] * 2
    assert sorted((t.user_name, t.workspace_name) for t in everyone) == [
        ("admin", "default"),
        ("alice", "default"),
        ("alice", "default"),
        ("bob", "team-b"),
    ]
    assert [(t.user_name, t.workspace_name) for t in theirs] == [("carol", "default")]
    assert all(len(t.prefix) == 12 for t in everyone)


async def _revoke(db: Database, clock: FakeClock, caller: str, reference: str) -> int:
    principal = await _principal(db, caller, clock)
    async with db.transaction() as session:
        return (await access.revoke_token(session, clock, principal, reference)).id


async def _revoked(db: Database) -> list[int]:
    async with db.read() as session:
        return list(
            await session.scalars(select(ApiToken.id).where(ApiToken.revoked_at.is_not(None)))
        )


async def test_a_member_cannot_revoke_another_users_token_nor_learn_it_exists(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    admin = await _principal(db, tenancy.admin_token, clock)
    bob = await _principal(db, tenancy.other_token, clock)
    foreign = await _principal(db, tenancy.foreign_token, clock)
    for target in (admin, bob, foreign):
        with pytest.raises(NotFound) as refused:
            await _revoke(db, clock, tenancy.member_token, str(target.token_id))
        assert refused.value.message == f"No token '{target.token_id}'."
    with pytest.raises(NotFound):
        await _revoke(db, clock, tenancy.member_token, tenancy.other_token[:12])
    # the organisation's admin cannot reach another organisation's either
    with pytest.raises(NotFound):
        await _revoke(db, clock, tenancy.admin_token, str(foreign.token_id))
    assert await _revoked(db) == []
    assert await _authenticate(db, tenancy.other_token, clock) == "bob"


async def test_a_revoked_token_is_refused_from_then_on(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    second = await _issue(db, clock, "alice", "default", None)
    bob = await _principal(db, tenancy.other_token, clock)
    # its owner, by its first characters; an admin, any of the organisation's, by its id
    own = await _revoke(db, clock, tenancy.member_token, second[:12])
    by_admin = await _revoke(db, clock, tenancy.admin_token, str(bob.token_id))
    assert sorted(await _revoked(db)) == sorted([own, by_admin])
    for secret in (second, tenancy.other_token):
        with pytest.raises(Unauthenticated) as refused:
            await _authenticate(db, secret, clock)
        assert refused.value.message == "The API token is unknown or revoked."
    assert await _authenticate(db, tenancy.member_token, clock) == "alice"


async def test_a_prefix_of_several_tokens_is_refused_and_nothing_revoked(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    with pytest.raises(Conflict) as refused:
        await _revoke(db, clock, tenancy.admin_token, "astx_")
    assert refused.value.message == ("'astx_' begins 3 tokens; give more characters or the id.")
    assert await _revoked(db) == []


async def test_the_watch_ends_streams_of_a_revoked_or_expired_token_only(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    expiring = await _issue(db, clock, "alice", "default", timedelta(minutes=5))
    ids = [
        (await _principal(db, s, clock)).token_id
        for s in (tenancy.member_token, tenancy.other_token, expiring)
    ]
    watch = TokenWatch(db, clock, look_seconds=0.05)
    async with (
        watch.watching(ids[0]) as kept,
        watch.watching(ids[1]) as revoked,
        watch.watching(ids[2]) as expired,
    ):
        await asyncio.sleep(0.2)
        assert not (kept.refused.is_set() or revoked.refused.is_set() or expired.refused.is_set())
        await _revoke(db, clock, tenancy.admin_token, str(ids[1]))
        clock.advance(minutes=5)
        async with asyncio.timeout(2):
            await revoked.refused.wait()
            await expired.refused.wait()
        assert revoked.reason == "The API token is unknown or revoked."
        assert expired.reason == "The API token has expired."
        await asyncio.sleep(0.2)
        assert not kept.refused.is_set()
        looks = watch.looks
    await asyncio.sleep(0.2)
    assert watch.looks - looks <= 1  # no stream left: the watch stops looking


async def _last_used(db: Database, secret: str) -> object:
    async with db.read() as session:
        return await session.scalar(
            select(ApiToken.last_used_at).where(ApiToken.token_hash == hash_token(secret))
        )


async def test_a_tokens_last_use_is_written_once_a_minute_through_rest_and_graphql(
    app: Starlette,
    client: httpx.AsyncClient,
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
) -> None:
    # `astraeus token list` shows LAST USED: an admin tells a token in use from one to revoke
    uses: access.TokenUses = app.state.token_uses
    member, other = tenancy.member_token, tenancy.other_token
    first = clock.now()
    answer = await client.get("/v1/goodput?by=run", headers={"Authorization": f"Bearer {member}"})
    assert answer.status_code == 200
    assert await _last_used(db, member) is None  # noted, written with the minute's others
    await uses.write(db)
    assert await _last_used(db, member) == first
    assert await _last_used(db, other) is None  # only the token that was used

    clock.advance(seconds=30)  # through GraphQL: the latest use is what is written
    query = {"query": "{ runs { totalCount } }"}
    headers = {"Authorization": f"Bearer {member}"}
    assert (await client.post("/graphql", json=query, headers=headers)).status_code == 200
    await uses.write(db)
    assert await _last_used(db, member) == clock.now()
    listed = await client.post(
        "/graphql", json={"query": "{ tokens { lastUsedAt } }"}, headers=headers
    )
    assert listed.json()["data"]["tokens"] == [{"lastUsedAt": clock.now().isoformat()}]

    # a refused request (another workspace's run) still used the token; a bad token writes none
    clock.advance(minutes=2)
    refused = await client.get("/v1/jobs/nope", headers={"Authorization": f"Bearer {other}"})
    assert refused.status_code == 404
    bad = await client.get("/v1/goodput?by=run", headers={"Authorization": "Bearer astx_x"})
    assert bad.status_code == 401
    await uses.write(db)
    assert await _last_used(db, other) == clock.now()
    assert uses.pending == {}


async def test_uses_noted_while_the_database_is_away_are_written_when_it_is_back(
    db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    uses = access.TokenUses()
    async with db.read() as session:
        principal = await access.authenticate(session, tenancy.member_token, clock.now())
    uses.note(principal, clock.now())
    away = Database.from_url("postgresql://astraeus@127.0.0.1:1/nowhere")  # refuses connections
    await uses.write(away)
    await away.dispose()
    assert uses.pending == {principal.token_id: clock.now()}  # kept for the next write
    await uses.write(db)
    assert await _last_used(db, tenancy.member_token) == clock.now()
