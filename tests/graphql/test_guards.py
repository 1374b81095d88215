"""What one GraphQL request may ask for (issue 18), refused before anything runs, and how
refusals are logged: one line each, a traceback only for what nobody expected."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from graphql import get_introspection_query, parse, specified_rules
from graphql.language import FragmentDefinitionNode
from strawberry.schema.schema import validate_document

from backend.cli import astra
from backend.resolvers.root import schema
from backend.schema import guards
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


# --- what the console and the CLI send pass the bounds (issue 37 N1) -------------------------

FRONTEND = Path(__file__).resolve().parents[2] / "frontend" / "src"
OPERATION = re.compile(r"const (\w+) = /\* GraphQL \*/ `(.*?)`", re.S)


def console_operations() -> dict[str, str]:
    """Each operation written in the console (a template marked /* GraphQL */), sent with the
    fragments it spreads, as its pages join them."""
    texts = []
    for path in sorted(FRONTEND.rglob("*.ts*")):
        if "generated" not in path.parts and ".test." not in path.name:
            texts += [
                (f"{path.name}:{name}", body) for name, body in OPERATION.findall(path.read_text())
            ]
    fragments = {
        definition.name.value: body
        for _, body in texts
        for definition in parse(body).definitions
        if isinstance(definition, FragmentDefinitionNode)
    }
    operations = {}
    for where, body in texts:
        if body.lstrip().startswith("fragment"):
            continue
        spread, wanted = set(), set(re.findall(r"\.\.\.(\w+)", body))
        while wanted - spread - {"on"}:
            name = (wanted - spread - {"on"}).pop()
            spread.add(name)
            wanted |= set(re.findall(r"\.\.\.(\w+)", fragments[name]))
        operations[where] = body + "".join(fragments[name] for name in sorted(spread))
    return operations


def cli_operations() -> dict[str, str]:
    """The CLI's documents: its modules' constants that are GraphQL operations."""
    found = {}
    for module in pkgutil.iter_modules(astra.__path__):
        held = importlib.import_module(f"backend.cli.astra.{module.name}")
        for name, value in vars(held).items():
            if isinstance(value, str) and re.match(r"\s*(query|mutation|subscription)\b", value):
                if "{field}" in value:  # a template its command fills in
                    value = value.format(field="stopRun")
                found[f"{module.name}:{name}"] = value
    return found


def test_every_operation_of_the_console_and_the_cli_passes_the_bounds() -> None:
    console, cli = console_operations(), cli_operations()
    assert len(console) >= 19 and len(cli) >= 15, (sorted(console), sorted(cli))
    for where, text in {**console, **cli, "introspection": get_introspection_query()}.items():
        document, refused = guards.prepare(text)
        assert refused is None and document is not None, (where, refused)
        rules = tuple(specified_rules)
        assert validate_document(schema._schema, document, rules) == [], where


async def test_a_document_not_checked_within_the_deadline_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # issue 37 N1: validation runs in a checking thread, waited for at most CHECK_DEADLINE_S
    monkeypatch.setattr(guards, "CHECK_DEADLINE_S", 0.001)
    heaviest = "{ " + "viewer { user } " * 149 + "}"  # 0.1 s of validation
    result = await schema.execute(heaviest)
    assert result.data is None and result.errors is not None
    assert [e.message for e in result.errors] == [
        "The request could not be checked within 0.001 s (the server is busy checking "
        "others); try again."
    ]
    assert result.errors[0].extensions == {"code": "TIME_BUDGET_EXCEEDED"}
    assert (heaviest, tuple(specified_rules)) not in guards._checked  # tried again next time
    monkeypatch.undo()
    await schema.execute(heaviest)
    assert guards._checked[(heaviest, tuple(specified_rules))][1] == []


async def test_a_body_nested_past_the_recursion_limit_is_a_400(client: httpx.AsyncClient) -> None:
    # issue 37 N1: 5 000 nested lists in the variables were a 500 and a traceback, unread
    nested = "[" * 5000 + "]" * 5000
    body = '{"query": "{ viewer { user } }", "variables": {"w": ' + nested + "}}"
    answer = await client.post(
        "/graphql", content=body, headers={"Content-Type": "application/json"}
    )
    assert (answer.status_code, answer.text) == (400, "Unable to parse request body as JSON")
