"""The GraphQL schema: exported SDL, permissions on every mutation, masked errors, loaders."""

from typing import Any

import httpx
import pytest
from sqlalchemy import event
from strawberry.permission import PermissionExtension

from backend.db import Database
from backend.resolvers.root import SDL_PATH, schema, sdl
from tests.support import Tenancy, row_counts, run_spec
from tests.support.api import CREATE, RUN_FIELDS, gql


def test_the_exported_sdl_is_current() -> None:
    assert SDL_PATH.read_text() == sdl(), "schema.graphql is stale: run `make schema`"


def test_every_query_mutation_and_subscription_field_carries_a_permission() -> None:
    for root in (schema.query, schema.mutation, schema.subscription):
        definition = root.__strawberry_definition__  # type: ignore[union-attr]
        for field in definition.fields:
            kinds = [type(e) for e in field.extensions]
            assert PermissionExtension in kinds, f"{definition.name}.{field.name} has no permission"


async def test_create_run_and_read_it_back(client: httpx.AsyncClient, tenancy: Tenancy) -> None:
    created = await gql(client, tenancy.member_token, CREATE, spec=run_spec())
    payload = created["data"]["createRun"]
    assert payload["errors"] == []
    run = payload["run"]
    assert (run["name"], run["state"], run["reason"], run["createdBy"]) == (
        "llama-sft",
        "Pending",
        "Run created",
        "alice",
    )
    assert [w["name"] for w in run["workers"]] == ["llama-sft-0", "llama-sft-1"]
    assert run["workers"][0] == {
        "name": "llama-sft-0",
        "rank": 0,
        "state": "Pending",
        "reason": "Waiting to be placed with its gang",
        "gpus": 1,
        "gpuIds": [],
        "restarts": 0,
        "restartAt": None,
        "exitCode": None,
        "lastFailure": None,
        "straggler": False,
    }
    assert run["history"] == [
        {
            "transitionAt": "2026-10-01T01:02:11.402117+00:00",
            "state": "Pending",
            "reason": "Run created",
        }
    ]
    read = await gql(
        client, tenancy.member_token, f'{{ run(name: "llama-sft") {{ {RUN_FIELDS} }} }}'
    )
    assert read["data"]["run"] == run


async def test_a_refused_spec_is_answered_in_the_schema_and_writes_nothing(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    before = await row_counts(db)
    answer = await gql(
        client,
        tenancy.member_token,
        CREATE,
        spec=run_spec(workers=0, mounts=[{"drive": "d", "path": "../rel"}]),
    )
    assert answer["data"]["createRun"] == {
        "run": None,
        "errors": [
            {"code": "INVALID_SPEC", "field": "workers", "message": "must be at least 1"},
            {
                "code": "INVALID_SPEC",
                "field": "mounts[0].path",
                "message": "must not contain '..'",
            },
        ],
    }
    assert await row_counts(db) == before


async def test_another_workspace_sees_nothing(client: httpx.AsyncClient, tenancy: Tenancy) -> None:
    await gql(client, tenancy.member_token, CREATE, spec=run_spec())
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        read = await gql(
            client, outsider, '{ run(name: "llama-sft") { name } runs(all: true) { name } }'
        )
        assert read["data"] == {"run": None, "runs": []}
        named = await gql(
            client, outsider, '{ run(name: "llama-sft", workspace: "default") { name } }'
        )
        assert named["data"] == {"run": None}
    # Bob, of team-b, may not submit into workspace 'default' of his organisation.
    created = await gql(client, tenancy.other_token, CREATE, spec=run_spec(name="x"), ws="default")
    assert created["data"]["createRun"]["errors"] == [
        {"code": "WORKSPACE_NOT_FOUND", "field": None, "message": "No workspace named 'default'."}
    ]
    # Carol's own workspace is also called 'default', in another organisation: hers is used.
    created = await gql(client, tenancy.foreign_token, CREATE, spec=run_spec(), ws="default")
    assert created["data"]["createRun"]["errors"] == []
    mine = await gql(client, tenancy.member_token, "{ runs { name createdBy } }")
    assert mine["data"]["runs"] == [{"name": "llama-sft", "createdBy": "alice"}]


async def test_an_org_admin_acts_in_another_workspace(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    created = await gql(client, tenancy.admin_token, CREATE, spec=run_spec(), ws="team-b")
    assert created["data"]["createRun"]["errors"] == []
    mine = await gql(
        client,
        tenancy.other_token,
        "{ runs { name createdBy } viewer { user workspace isOrgAdmin } }",
    )
    assert mine["data"] == {
        "runs": [{"name": "llama-sft", "createdBy": "admin"}],
        "viewer": {"user": "bob", "workspace": "team-b", "isOrgAdmin": False},
    }


@pytest.mark.parametrize("token", [None, "astx_" + "1" * 40])
async def test_without_a_valid_token_every_field_is_refused(
    client: httpx.AsyncClient, tenancy: Tenancy, token: str | None
) -> None:
    answer = await gql(client, token, "{ runs { name } }")
    assert answer["data"] is None
    assert answer["errors"][0]["extensions"] == {"code": "UNAUTHENTICATED"}
    created = await gql(client, token, CREATE, spec=run_spec())
    assert created["data"] is None
    assert created["errors"][0]["message"].startswith("A valid API token is required")


async def test_runs_with_workers_and_history_take_a_fixed_number_of_statements(
    client: httpx.AsyncClient, db: Database, tenancy: Tenancy
) -> None:
    # The run page's fields: its workers with their history, how they were started, and where
    # they were placed last (the Workers tab's Machine and GPUs of an ended worker) too.
    page = (
        "workers { history { state reason } started { image command rank environment } "
        "lastPlacement { machine gpuIds } }"
    )
    query = f"{{ runs {{ {RUN_FIELDS} {page} }} }}"

    async def statements_for_listing() -> int:
        seen: list[str] = []

        def count(*args: Any) -> None:
            seen.append(args[2])

        event.listen(db.engine.sync_engine, "before_cursor_execute", count)
        try:
            answer = await gql(client, tenancy.member_token, query)
        finally:
            event.remove(db.engine.sync_engine, "before_cursor_execute", count)
        assert "errors" not in answer
        return len([s for s in seen if s.lstrip().upper().startswith("SELECT")])

    await gql(client, tenancy.member_token, CREATE, spec=run_spec(name="r0"))
    one = await statements_for_listing()
    for i in range(1, 6):
        await gql(client, tenancy.member_token, CREATE, spec=run_spec(name=f"r{i}"))
    six = await statements_for_listing()
    assert six == one  # no N+1: runs, workers, history, users, ledgers: one query each


def test_unexpected_errors_are_masked_and_expected_ones_shown() -> None:
    from graphql import GraphQLError

    from backend.errors import NotFound
    from backend.resolvers.root import _should_mask

    assert _should_mask(GraphQLError("boom", original_error=RuntimeError("db password=x")))
    assert not _should_mask(GraphQLError("gone", original_error=NotFound("X", "gone")))
    assert not _should_mask(GraphQLError("Cannot query field 'x' on type 'Query'."))


async def test_a_resolver_that_breaks_answers_a_masked_error(
    client: httpx.AsyncClient, tenancy: Tenancy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backend.runs import service as runs

    async def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("connection to 10.0.0.7 refused, password=hunter2")

    monkeypatch.setattr(runs, "list_runs", broken)
    answer = await gql(client, tenancy.member_token, "{ runs { name } }")
    assert answer["errors"][0]["message"] == "Unexpected error."
    assert "hunter2" not in str(answer)
