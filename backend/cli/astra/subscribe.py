"""A GraphQL subscription over a WebSocket (graphql-transport-ws), as the CLI follows things."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from backend.cli.astra.client import (
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Api,
    CliError,
    exit_for,
)


def subscribe(api: Api, query: str, field: str, **variables: Any) -> Iterator[dict[str, Any]]:
    """Each value of the subscription's ``field`` until the server completes it; errors as a
    CliError (refused: EXIT_REFUSED; server gone or unreachable: EXIT_UNREACHABLE)."""
    try:
        with connect(api.websocket_url, subprotocols=[Subprotocol("graphql-transport-ws")]) as ws:
            auth = {"Authorization": f"Bearer {api.target.token}"}
            ws.send(json.dumps({"type": "connection_init", "payload": auth}))
            json.loads(ws.recv())
            payload = {"query": query, "variables": variables}
            ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": payload}))
            for raw in ws:
                message = json.loads(raw)
                if message["type"] == "next":
                    found = message["payload"]
                    if found.get("errors"):
                        error = found["errors"][0]
                        said = str((error.get("extensions") or {}).get("code") or "")
                        raise CliError(f"astra: {error['message']}", exit_for(said))
                    yield found["data"][field]
                elif message["type"] == "error":
                    raise CliError(f"astra: {message['payload'][0]['message']}", EXIT_REFUSED)
                elif message["type"] == "complete":
                    return
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd is not None else None
        if code == 4403:
            raise CliError("astra: A valid API token is required.", EXIT_USAGE) from None
        raise CliError(
            f"astra: the server closed the stream at {api.websocket_url} ({code})",
            EXIT_UNREACHABLE,
        ) from None
    except (OSError, InvalidHandshake) as exc:
        raise CliError(
            f"astra: cannot follow at {api.websocket_url}: {exc}", EXIT_UNREACHABLE
        ) from None
