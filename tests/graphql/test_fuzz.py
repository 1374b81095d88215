"""schemathesis against the GraphQL schema of a live `astraeus up`: generated queries and
mutations of every root field, with a token; none may answer a server error (issue 6)."""

from __future__ import annotations

from typing import Any

import graphql
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.pytest import from_fixture

from tests.e2e.live import Server


@pytest.fixture(scope="module")
def graphql_schema(live: tuple[Server, str]) -> schemathesis.BaseSchema:
    server, token = live
    return schemathesis.graphql.from_url(
        f"{server.url}/graphql", headers={"Authorization": f"Bearer {token}"}
    )


def value_node(value: Any) -> graphql.ValueNode:
    """A JSON value as a GraphQL literal."""
    if value is None:
        return graphql.NullValueNode()
    if isinstance(value, bool):
        return graphql.BooleanValueNode(value=value)
    if isinstance(value, int):
        return graphql.IntValueNode(value=str(value))
    if isinstance(value, float):
        return graphql.FloatValueNode(value=repr(value))
    if isinstance(value, str):
        return graphql.StringValueNode(value=value)
    if isinstance(value, list):
        return graphql.ListValueNode(values=tuple(value_node(v) for v in value))
    return graphql.ObjectValueNode(
        fields=tuple(
            graphql.ObjectFieldNode(name=graphql.NameNode(value=k), value=value_node(v))
            for k, v in value.items()
        )
    )


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
# Run specifications: most nearly right (a name, a command, GPUs), some anything at all.
SPECS = st.fixed_dictionaries(
    {
        "name": st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True),
        "command": st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3),
    },
    optional={
        "gpus": st.integers(-1, 16),
        "workers": st.integers(-1, 4),
        "environment": st.dictionaries(
            st.from_regex(r"[A-Z]{1,5}", fullmatch=True), st.text(max_size=5), max_size=2
        ),
        "priority": st.integers(-5, 200),
        "restart_policy": st.sampled_from(["never", "on-failure", "always", "sometimes"]),
    },
)
schemathesis.graphql.scalar("JSON", (SPECS | JSON_VALUES).map(value_node))

schema = from_fixture("graphql_schema")
MASKED = "Unexpected error."  # strawberry's MaskErrors


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_generated_query_or_mutation_is_a_server_error(
    case: schemathesis.Case,
    live: tuple[Server, str],
) -> None:
    server, token = live
    response = case.call(
        base_url=f"{server.url}/graphql", headers={"Authorization": f"Bearer {token}"}
    )
    # Refusals (a workspace not found, a bad period) are errors with their sentence, which
    # schemathesis's own GraphQL check counts as server errors; ours: no 5xx, and no error
    # the schema had to mask (something unexpected broke).
    assert response.status_code < 500, (case.body, response.text)
    body = response.json()
    assert "data" in body or "errors" in body, body
    for error in body.get("errors") or []:
        assert error["message"] != MASKED, (case.body, body)
