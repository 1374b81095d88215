"""Bearer tokens: stored hashed, refused clearly, scoped to a workspace."""

import pytest
from sqlalchemy import select, update

from backend.access import service as access
from backend.access.rules import hash_token
from backend.db import Database
from backend.errors import Unauthenticated
from backend.models import ApiToken
from tests.support import FakeClock, Tenancy


async def test_a_token_names_its_user_workspace_and_rights(db: Database, tenancy: Tenancy) -> None:
    async with db.read() as session:
        admin = await access.authenticate(session, tenancy.admin_token)
        member = await access.authenticate(session, tenancy.member_token)
        other = await access.authenticate(session, tenancy.other_token)
    assert (admin.user_name, admin.workspace_name, admin.is_org_admin) == ("admin", "default", True)
    assert (member.user_name, member.workspace_name, member.is_org_admin) == (
        "alice",
        "default",
        False,
    )
    assert (other.workspace_name, other.organization_name) == ("team-b", "default")
    assert member.can_see_workspace(member.workspace_id or 0, member.organization_id)
    assert not member.can_see_workspace(other.workspace_id or 0, other.organization_id)
    assert admin.can_see_workspace(other.workspace_id or 0, other.organization_id)


async def test_tokens_are_stored_only_as_their_digest(db: Database, tenancy: Tenancy) -> None:
    async with db.read() as session:
        rows = list(await session.scalars(select(ApiToken)))
    stored = {r.token_hash for r in rows}
    assert hash_token(tenancy.admin_token) in stored
    for row in rows:
        assert tenancy.admin_token not in (row.token_hash, row.prefix, row.name)
        assert len(row.prefix) == 12


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        (None, "An API token is required: send 'Authorization: Bearer <token>'."),
        ("", "An API token is required: send 'Authorization: Bearer <token>'."),
        ("hunter2", "The API token is malformed."),
        ("astx_" + "x" * 43, "The API token is unknown or revoked."),
    ],
)
async def test_a_bad_token_is_refused_with_a_reason(
    db: Database, tenancy: Tenancy, secret: str | None, message: str
) -> None:
    async with db.read() as session:
        with pytest.raises(Unauthenticated) as caught:
            await access.authenticate(session, secret)
    assert caught.value.message == message
    assert caught.value.status == 401


async def test_a_revoked_token_is_refused(db: Database, tenancy: Tenancy, clock: FakeClock) -> None:
    async with db.transaction() as session:
        await session.execute(
            update(ApiToken)
            .where(ApiToken.token_hash == hash_token(tenancy.member_token))
            .values(revoked_at=clock.now())
        )
    async with db.read() as session:
        with pytest.raises(Unauthenticated, match="unknown or revoked"):
            await access.authenticate(session, tenancy.member_token)
