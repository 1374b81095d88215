"""A GraphQL subscription as the CLI follows things: its results, or errors as exit codes
(the protocol: graphql_ws)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from backend.cli.astra.client import (
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Api,
    CliError,
    exit_for,
)
from backend.cli.astra.graphql_ws import CLOSED_UNAUTHORISED, follow


def subscribe(api: Api, query: str, field: str, **variables: Any) -> Iterator[dict[str, Any]]:
    """Each value of the subscription's ``field`` until the server completes it; errors as a
    CliError (refused: EXIT_REFUSED; server gone or unreachable: EXIT_UNREACHABLE)."""
    try:
        for found in follow(api.websocket_url, api.target.token, query, **variables):
            if found.get("errors"):
                error = found["errors"][0]
                said = str((error.get("extensions") or {}).get("code") or "")
                raise CliError(f"astra: {error['message']}", exit_for(said))
            yield api.answer(found["data"])[field]
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd is not None else None
        if code == CLOSED_UNAUTHORISED:
            raise CliError("astra: A valid API token is required.", EXIT_USAGE) from None
        raise CliError(
            f"astra: the server closed the stream at {api.websocket_url} ({code})",
            EXIT_UNREACHABLE,
        ) from None
    except (OSError, InvalidHandshake) as exc:
        raise CliError(
            f"astra: cannot follow at {api.websocket_url}: {exc}", EXIT_UNREACHABLE
        ) from None
