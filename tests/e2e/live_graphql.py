"""A graphql-transport-ws client for the tests and benchmarks: a real WebSocket, the protocol
by hand (connection_init with the token, subscribe, next … complete)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

PROTOCOL = "graphql-transport-ws"


async def subscribe(
    url: str, token: str | None, query: str, **variables: Any
) -> AsyncIterator[dict[str, Any]]:
    """Each result (``data`` or ``errors``) of the subscription, until it completes."""
    async with connect(url.replace("http", "ws", 1) + "/graphql", subprotocols=[PROTOCOL]) as ws:
        await initialise(ws, token)
        await ws.send(
            json.dumps(
                {
                    "id": "1",
                    "type": "subscribe",
                    "payload": {"query": query, "variables": variables},
                }
            )
        )
        async for raw in ws:
            message = json.loads(raw)
            if message["type"] == "next":
                yield message["payload"]
            elif message["type"] == "error":
                yield {"errors": message["payload"]}
                return
            elif message["type"] == "complete":
                return


async def initialise(ws: ClientConnection, token: str | None) -> None:
    payload = {"Authorization": f"Bearer {token}"} if token else {}
    await ws.send(json.dumps({"type": "connection_init", "payload": payload}))
    ack = json.loads(await ws.recv())
    assert ack["type"] == "connection_ack", ack
