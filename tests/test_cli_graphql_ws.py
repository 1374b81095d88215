"""The one graphql-transport-ws client's messages (backend/cli/astra/graphql_ws.py), pure; the
live tests (tests/e2e/test_subscriptions.py, astra logs -f) use it against a server."""

from __future__ import annotations

import json

from backend.cli.astra.graphql_ws import init_message, read, subscribe_message, websocket_url


def test_the_token_goes_in_connection_init_and_none_sends_an_empty_payload() -> None:
    assert json.loads(init_message("astx_abc")) == {
        "type": "connection_init",
        "payload": {"Authorization": "Bearer astx_abc"},
    }
    assert json.loads(init_message(None)) == {"type": "connection_init", "payload": {}}


def test_a_subscription_is_its_query_and_variables() -> None:
    assert json.loads(subscribe_message("subscription { events { id } }", {"w": "a-0"})) == {
        "id": "1",
        "type": "subscribe",
        "payload": {"query": "subscription { events { id } }", "variables": {"w": "a-0"}},
    }


def test_messages_read_as_results_and_the_end() -> None:
    assert read('{"id": "1", "type": "next", "payload": {"data": {"x": 1}}}') == (
        {"data": {"x": 1}},
        False,
    )
    errors = [{"message": "Unknown field"}]
    assert read(json.dumps({"id": "1", "type": "error", "payload": errors})) == (
        {"errors": errors},
        True,
    )
    assert read('{"id": "1", "type": "complete"}') == (None, True)
    assert read('{"type": "ping"}') == (None, False)


def test_the_websocket_address_of_a_server() -> None:
    assert websocket_url("http://127.0.0.1:8080") == "ws://127.0.0.1:8080/graphql"
    assert websocket_url("https://astraeus.example/") == "wss://astraeus.example/graphql"
