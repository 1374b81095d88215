"""The REST shim's OpenAPI document: it lists every route, and schemathesis finds no 5xx and
no answer that breaks the document, against a live `astraeus up` (issue 6)."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from pydantic import ValidationError
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.pytest import from_fixture
from starlette.routing import Mount, Route

from backend.accounting.rules import Category
from backend.app import create_app
from backend.config import Settings
from backend.rest import answers
from backend.rest.openapi import document
from tests.e2e.live import Server
from tests.support.http import HTTP


def test_the_document_lists_every_route_of_the_shim(tmp_path: object) -> None:
    app = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:", agent_port=0))
    mount = next(r for r in app.routes if isinstance(r, Mount) and r.path == "/v1")
    served = {r.path for r in mount.routes if isinstance(r, Route)} - {"/openapi.json"}
    assert served == set(document()["paths"])


def test_a_ledger_answer_has_every_category_and_a_body_no_undeclared_field() -> None:
    # the document is generated from the models the routes serialise through (issue 22): a
    # category added to the ledger, or a field a route writes that no model declares, fails
    # here and in the route rather than drifting from the document
    assert list(answers.Hours.model_fields) == [c.value for c in Category]
    assert document()["components"]["schemas"]["Hours"]["required"] == [c.value for c in Category]
    with pytest.raises(ValidationError):
        answers.Intervals.model_validate({"intervals": [], "more": True})


def test_parameters_come_from_the_query_models() -> None:
    listed = document()["paths"]["/goodput/intervals"]["get"]["parameters"]
    assert {p["name"]: p.get("required", False) for p in listed} == {
        "by": False,
        "start": False,
        "end": False,
        "workspace": False,
        "name": True,
        "category": False,
        "limit": False,
    }
    limit = next(p for p in listed if p["name"] == "limit")
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 10_000}
    assert limit["description"] == "At most this many: 1 000 by default."


@pytest.fixture(scope="module")
def api(live: tuple[Server, str]) -> schemathesis.BaseSchema:
    server, _ = live
    return schemathesis.openapi.from_dict(HTTP.get(f"{server.url}/v1/openapi.json").json())


schema = from_fixture("api")


@schema.parametrize()
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_server_error_and_every_answer_as_documented(
    case: schemathesis.Case, live: tuple[Server, str]
) -> None:
    server, token = live
    case.call_and_validate(
        base_url=f"{server.url}/v1",
        headers={"Authorization": f"Bearer {token}"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )


async def test_no_route_and_a_wrong_method_answer_json_on_the_api(
    client: httpx.AsyncClient,
) -> None:
    for path in ("/v1/nope", "/api/v1/jobs/a/b/c", "/v1/tasks/bad%0Aname/x"):
        answer = await client.get(path)
        assert answer.status_code == 404
        assert answer.json()["code"] == "NOT_FOUND"
        assert answer.json()["message"].startswith("No such endpoint: /")
    wrong = await client.post("/v1/goodput")
    assert wrong.status_code == 405 and wrong.json()["code"] == "METHOD_NOT_ALLOWED"
    served = await client.get("/v1/openapi.json")
    assert served.json()["openapi"] == "3.1.0"  # no token needed to read what the API is
