"""The one parser of 'Authorization: Bearer <token>' (REST, GraphQL over HTTP and WebSocket, the
agents' gRPC metadata)."""

from __future__ import annotations

import pytest

from backend.access.rules import bearer_secret

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("header", "secret"),
    [
        ("Bearer astra_abc", "astra_abc"),
        ("bearer astra_abc", "astra_abc"),
        ("BEARER  astra_abc ", "astra_abc"),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer", None),
        ("", None),
        (None, None),
    ],
)
def test_a_token_is_read_from_a_bearer_header_only(header: str | None, secret: str | None) -> None:
    assert bearer_secret(header) == secret
