"""What one GraphQL request may ask for (issue 18), refused before anything runs, and how
refusals are logged: one line each, a traceback only for what nobody expected."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from tests.support import Tenancy


async def ask(
    client: httpx.AsyncClient, token: str | None, query: str, **variables: Any
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = await client.post(
        "/graphql", json={"query": query, "variables": variables}, headers=headers
    )
    assert answer.status_code == 200
    return dict(answer.json())


def codes(body: dict[str, Any]) -> list[str | None]:
    return [e.get("extensions", {}).get("code") for e in body["errors"]]


async def test_control_characters_are_refused_by_argument_before_running(
    client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    literal = await ask(client, tenancy.member_token, '{ run(name: "a\\u0000b") { name } }')
    assert literal == {
        "data": None,
        "errors": [
            {
                "message": "name: must not hold NUL or other control characters",
                "extensions": {"code": "INVALID_PARAMETER"},
            }
        ],
    }
    variable = await ask(
        client,
        tenancy.member_token,
        "query($w: String) { runs(workspace: $w) { name } }",
        w="default\x1b[2J",
    )
    assert variable["errors"][0]["message"] == ("$w: must not hold NUL or other control characters")
    # a run's spec (JSON) is checked field by field by its own validator, among its other
    # errors (seed: createRun's errors { field message })
    spec = await ask(
        client,
        tenancy.member_token,
        "mutation($s: JSON!) { createRun(spec: $s) { errors { field message } } }",
        s={
            "name": "x",
            "gpus": 1,
            "environment": {"A": "\x1b[2J", "NVIDIA_VISIBLE_DEVICES": "all"},
        },
    )
    assert {e["field"] for e in spec["data"]["createRun"]["errors"]} == {
        "environment.A",
        "environment.NVIDIA_VISIBLE_DEVICES",
    }
    literal_spec = await ask(
        client,
        tenancy.member_token,
        'mutation { createRun(spec: {name: "x", gpus: 1, command: ["a\\u0000"]}) '
        "{ errors { field } } }",
    )
    assert literal_spec["data"]["createRun"]["errors"] == [{"field": "command[0]"}]
    # tab, line feed and carriage return are text (a PEM key, a script)
    kept = await ask(
        client,
        tenancy.member_token,
        'mutation($v: String!) { setSecret(name: "pem", value: $v) { errors { field } } }',
        v="-----BEGIN KEY-----\n\tabc\r\n-----END KEY-----\n",
    )
    assert "errors" not in kept, kept


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("{ " + " ".join(f"a{i}: viewer {{ user }}" for i in range(31)) + " }", "31 aliases"),
        ("{ runs { " + "workers { run { " * 5 + "name" + " } }" * 5 + " } }", "maximum operation"),
        ("{ " + "__typename " * 2000 + "}", "more than 2000 tokens"),
    ],
    ids=["aliases", "depth", "tokens"],
)
async def test_a_request_past_a_bound_is_refused_before_running(
    client: httpx.AsyncClient, tenancy: Tenancy, query: str, message: str
) -> None:
    body = await ask(client, tenancy.member_token, query)
    assert body.get("data") is None
    assert message in body["errors"][0]["message"], body


async def test_refusals_are_logged_in_one_line_and_a_bug_with_its_traceback(
    client: httpx.AsyncClient,
    tenancy: Tenancy,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO)
    anonymous = await ask(client, None, "{ gpus { line } }")
    assert codes(anonymous) == ["UNAUTHENTICATED"]
    bad_time = await ask(
        client, tenancy.member_token, '{ goodput(start: "10000-01-01T00:00:00Z") { by } }'
    )
    assert "cannot represent a DateTime" in bad_time["errors"][0]["message"]
    refused = [r for r in caplog.records if r.name == "backend.graphql"]
    assert [r.getMessage().split(":")[1].strip() for r in refused] == [
        "UNAUTHENTICATED",
        "INVALID_REQUEST",
    ]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in refused)

    from backend.runs import service as runs

    async def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(runs, "list_runs", broken)
    caplog.clear()
    masked = await ask(client, tenancy.member_token, "{ runs { name } }")
    assert masked["errors"][0]["message"] == "Unexpected error."
    assert any("RuntimeError: a bug" in r.getMessage() or r.exc_info for r in caplog.records)
