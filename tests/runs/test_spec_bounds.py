"""A specification past its bounds is refused on every path it enters, and writes nothing
(issue 18): the service, GraphQL's createRun and runAgain (the CLI's submit sends its file
through createRun; the REST shim takes no specification)."""

from typing import Any

import httpx
import pytest
from sqlalchemy import update

from backend.access import service as access
from backend.config import Settings
from backend.db import Database
from backend.errors import InvalidInput
from backend.models import Run
from backend.runs import service as runs
from tests.support import FakeClock, Tenancy, row_counts, run_spec

MIB = 2**20
FIVE_MIB_VALUE = "environment.BIG: a value is at most 64 KiB (this one is 5.0 MiB)"

CREATE = """mutation($spec: JSON!) {
  createRun(spec: $spec) { run { name } errors { code field message } }
}"""
AGAIN = """mutation($name: String!, $newName: String!) {
  runAgain(name: $name, newName: $newName) { run { name } errors { code field message } }
}"""


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Request bodies up to 8 MiB (1 MiB by default, where a 5 MiB spec is refused unread with
    413): past the body's bound, the spec's own bounds refuse it field by field."""
    return settings.model_copy(update={"max_body_bytes": 8 * MIB})


async def _graphql(client: httpx.AsyncClient, token: str, query: str, **variables: Any) -> Any:
    answer = await client.post(
        "/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200, answer.text[:300]
    return answer.json()


async def test_a_five_mib_value_is_refused_by_the_service_and_writes_nothing(
    db: Database, tenancy: Tenancy, clock: FakeClock
) -> None:
    async with db.read() as session:
        alice = await access.authenticate(session, tenancy.member_token)
    before = await row_counts(db)
    with pytest.raises(InvalidInput) as caught:
        async with db.transaction() as session:
            await runs.create_run(
                session, clock, alice, run_spec(environment={"BIG": "x" * 5 * MIB})
            )
    assert caught.value.code == "INVALID_SPEC"
    assert [str(f) for f in caught.value.fields] == [FIVE_MIB_VALUE]
    assert await row_counts(db) == before


async def test_graphql_refuses_a_five_mib_spec_with_the_field_error(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    before = await row_counts(db)
    answer = await _graphql(
        client,
        tenancy.member_token,
        CREATE,
        spec=run_spec(environment={"BIG": "x" * 5 * MIB}),
    )
    assert answer["data"]["createRun"] == {
        "run": None,
        "errors": [
            {
                "code": "INVALID_SPEC",
                "field": "environment.BIG",
                "message": "a value is at most 64 KiB (this one is 5.0 MiB)",
            }
        ],
    }
    assert await row_counts(db) == before


async def test_graphql_names_every_bound_passed_at_once(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    before = await row_counts(db)
    spec = run_spec(
        command=["python", "y" * 70_000],
        mounts=[{"drive": "data", "path": f"/d{i}"} for i in range(65)],
        environment={f"V{i}": "x" * 60_000 for i in range(5)},
    )
    answer = await _graphql(client, tenancy.member_token, CREATE, spec=spec)
    assert [(e["field"], e["message"]) for e in answer["data"]["createRun"]["errors"]] == [
        ("command[1]", "an argument is at most 64 KiB (this one is 68.4 KiB)"),
        ("mounts", "must have at most 64 items (this one has 65)"),
    ]
    assert await row_counts(db) == before


async def test_run_again_checks_the_bounds_of_the_spec_it_copies(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    # A run kept from before the bounds may hold a value past them: its copy is refused.
    created = await _graphql(client, tenancy.member_token, CREATE, spec=run_spec())
    assert created["data"]["createRun"]["errors"] == []
    async with db.transaction() as session:
        await session.execute(
            update(Run).values(
                spec=run_spec(cluster="local", environment={"BIG": "x" * 100 * 1024})
            )
        )
    before = await row_counts(db)
    answer = await _graphql(
        client, tenancy.member_token, AGAIN, name="llama-sft", newName="llama-sft-2"
    )
    assert answer["data"]["runAgain"] == {
        "run": None,
        "errors": [
            {
                "code": "INVALID_SPEC",
                "field": "environment.BIG",
                "message": "a value is at most 64 KiB (this one is 100.0 KiB)",
            }
        ],
    }
    assert await row_counts(db) == before
