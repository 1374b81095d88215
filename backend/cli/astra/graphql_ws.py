"""The one graphql-transport-ws client: ``connection_init`` with the token, ``subscribe``,
then ``next`` … ``complete`` (or ``error``) on a real WebSocket. The CLI follows with the
blocking one (``follow``), the tests and benchmarks with the asyncio one (``subscribe``);
both yield each result as the server sent it: ``{"data": …}`` or ``{"errors": […]}``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as connect_async
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect as connect_sync
from websockets.typing import Subprotocol

PROTOCOL = Subprotocol("graphql-transport-ws")
CLOSED_UNAUTHORISED = 4403  # the server's close code for a missing or bad token


def websocket_url(server: str) -> str:
    """The GraphQL endpoint's WebSocket address of a server's http(s) address."""
    return server.replace("http", "ws", 1).rstrip("/") + "/graphql"


def init_message(token: str | None) -> str:
    payload = {"Authorization": f"Bearer {token}"} if token else {}
    return json.dumps({"type": "connection_init", "payload": payload})


def subscribe_message(query: str, variables: dict[str, Any], id_: str = "1") -> str:
    payload = {"query": query, "variables": variables}
    return json.dumps({"id": id_, "type": "subscribe", "payload": payload})


def read(raw: str | bytes) -> tuple[dict[str, Any] | None, bool]:
    """A message as (the result it carries, whether the subscription ended): ``next``'s
    payload; ``error``'s errors as a result, and the end; ``complete``: the end; anything
    else (a ping): nothing."""
    message = json.loads(raw)
    kind = message.get("type")
    if kind == "next":
        payload: dict[str, Any] = message["payload"]
        return payload, False
    if kind == "error":
        return {"errors": message["payload"]}, True
    return None, kind == "complete"


def _acknowledged(raw: str | bytes) -> None:
    ack = json.loads(raw)
    if ack.get("type") != "connection_ack":
        raise ConnectionError(f"not acknowledged: {ack}")


def follow(url: str, token: str | None, query: str, **variables: Any) -> Iterator[dict[str, Any]]:
    """Each result of the subscription until it completes or errs (blocking). Raises what
    websockets raises: ConnectionClosed (code 4403: no valid token), InvalidHandshake,
    OSError."""
    with connect_sync(url, subprotocols=[PROTOCOL]) as ws:
        initialise_sync(ws, token)
        ws.send(subscribe_message(query, variables))
        for raw in ws:
            result, ended = read(raw)
            if result is not None:
                yield result
            if ended:
                return


def initialise_sync(ws: SyncConnection, token: str | None) -> None:
    ws.send(init_message(token))
    _acknowledged(ws.recv())


async def subscribe(
    url: str, token: str | None, query: str, **variables: Any
) -> AsyncIterator[dict[str, Any]]:
    """Each result of the subscription until it completes or errs; ``url``: the server's
    http(s) address."""
    async with connect_async(websocket_url(url), subprotocols=[PROTOCOL]) as ws:
        await initialise(ws, token)
        await ws.send(subscribe_message(query, variables))
        async for raw in ws:
            result, ended = read(raw)
            if result is not None:
                yield result
            if ended:
                return


async def initialise(ws: ClientConnection, token: str | None) -> None:
    await ws.send(init_message(token))
    _acknowledged(await ws.recv())
