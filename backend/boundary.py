"""What every HTTP request and answer passes through: request bodies bounded before they are
read, and the console's security headers on every answer."""

from __future__ import annotations

import json
import re

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MIB = 1024 * 1024

# NUL and the C0 controls but tab, line feed and carriage return (kept in secret values, PEM
# keys and commands), and DEL: PostgreSQL refuses NUL in text, and no name holds the others.
_REFUSED = frozenset(chr(c) for c in (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F))


def has_control_characters(text: str) -> bool:
    """Whether a parameter holds a character no parameter may (refused with 400 naming it)."""
    return not _REFUSED.isdisjoint(text)


class BodyTooLarge(Exception):
    """A body that streamed (chunked) past the limit: raised from ``receive``, answered 413."""


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else -1
    return None


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"code": code, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit % MIB == 0 else f"{limit} bytes"


class BodyLimit:
    """Refuses a request body over ``limit`` bytes with 413: at once when Content-Length says
    so (nothing of it is read; uvicorn stops reading the socket while nobody receives, and
    closes the connection after the answer), else counted as the chunks stream and cut at the
    limit. Four 100 MB bodies raised the server's memory by 600 MB when GraphQL read them."""

    def __init__(
        self, app: ASGIApp, limit: int, larger: tuple[tuple[re.Pattern[str], int], ...] = ()
    ) -> None:
        # ``larger``: paths (a pattern of the request's path) whose bodies may be larger, as a
        # run's code is (backend/rest/code.py), and their own limit
        self.app, self.default, self.larger = app, limit, larger

    def _limit(self, scope: Scope) -> int:
        path = str(scope.get("path", ""))
        return next((limit for p, limit in self.larger if p.match(path)), self.default)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope)
        declared = _declared_length(scope)
        if declared is not None and declared < 0:
            await _refuse(send, 400, "INVALID_CONTENT_LENGTH", "Content-Length must be a number.")
            return
        if declared is not None and declared > limit:
            await self._too_large(send, limit)
            return
        seen = 0
        answered = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge()
            return message

        async def watched(message: Message) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if not answered:
                await self._too_large(send, limit)
        except ClientDisconnect:
            # The client went away before its body was whole (a page left, a tab closed):
            # no one to answer, and nothing went wrong here (it is not a server error).
            return

    async def _too_large(self, send: Send, limit: int) -> None:
        message = f"A request body is at most {_size(limit)}."
        await _refuse(send, 413, "PAYLOAD_TOO_LARGE", message)


# A Host header fit to be named in a policy: a name or an address, maybe a port.
_HOST = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$")


def content_security_policy(host: str | None) -> str:
    """Only the console's own files (its scripts are files of its own origin, never inline:
    Vite's build writes none), and its API and subscriptions' WebSocket on the same origin.
    'self' covers ws: and wss: of the origin in CSP 3; the WebSocket origin is also named for
    browsers that read CSP 2."""
    sockets = f" ws://{host} wss://{host}" if host and _HOST.match(host) else ""
    return (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        f"font-src 'self'; connect-src 'self'{sockets}; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    )


SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class SecurityHeaders:
    """The console's security headers on every HTTP answer, its pages and the API's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        policy = content_security_policy(host).encode()
        # Over TLS, browsers are told to come back over TLS only (a year).
        strict = [(b"strict-transport-security", b"max-age=31536000")]
        always = [*SECURITY_HEADERS, *(strict if scope.get("scheme") == "https" else [])]

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                added = [(n, v) for n, v in always if n not in present]
                if b"content-security-policy" not in present:
                    added.append((b"content-security-policy", policy))
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, with_headers)
