"""The HTTP boundary's middlewares (issue 18), on a small Starlette app of their own: bodies
bounded before they are read, the security headers on every answer."""

from __future__ import annotations

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message

from backend.boundary import BodyLimit, SecurityHeaders, content_security_policy

read: list[int] = []


async def echo(request: Request) -> Response:
    body = await request.body()
    read.append(len(body))
    return JSONResponse({"read": len(body)})


async def framed(request: Request) -> Response:
    return Response("x", headers={"Content-Security-Policy": "default-src 'none'"})


APP = Starlette(
    routes=[Route("/echo", echo, methods=["POST"]), Route("/framed", framed)],
    middleware=[Middleware(SecurityHeaders), Middleware(BodyLimit, limit=1024)],
)


def client(base: str = "http://astraeus.test") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=APP), base_url=base)


async def test_a_body_over_the_bound_is_refused_unread_and_one_within_is_read() -> None:
    read.clear()
    async with client() as c:
        over = await c.post("/echo", content=b"x" * 1025)
        within = await c.post("/echo", content=b"x" * 1024)

        async def chunks():  # no Content-Length: counted as it streams
            for _ in range(4):
                yield b"x" * 512

        streamed = await c.post("/echo", content=chunks())
        bad = await c.post("/echo", content=b"x", headers={"Content-Length": "many"})
    assert over.status_code == 413
    assert over.json() == {
        "code": "PAYLOAD_TOO_LARGE",
        "message": "A request body is at most 1024 bytes.",
    }
    assert over.headers["connection"] == "close"
    assert within.json() == {"read": 1024}
    assert streamed.status_code == 413
    assert bad.status_code == 400
    assert read == [1024]  # the refused bodies never reached the route


async def test_a_client_gone_before_its_body_is_whole_is_no_error() -> None:
    """A browser that leaves a page while a query's body is sent: the route's read ends with
    ClientDisconnect, which is not a server error (no traceback, no 500)."""
    read.clear()
    sent: list[Message] = []
    body = [
        {"type": "http.request", "body": b"x" * 10, "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return body.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/echo",
        "raw_path": b"/echo",
        "query_string": b"",
        "headers": [(b"host", b"astraeus.test")],
        "scheme": "http",
        "server": ("astraeus.test", 80),
        "http_version": "1.1",
        "root_path": "",
    }
    await APP(scope, receive, send)  # raises nothing
    assert sent == [] and read == []


async def test_every_answer_has_the_headers_and_a_route_keeps_its_own_policy() -> None:
    async with client() as c:
        refused = await c.post("/echo", content=b"x" * 2000)
        own = await c.get("/framed")
        missing = await c.get("/nowhere")
    for answer in (refused, missing):
        assert answer.headers["content-security-policy"] == content_security_policy("astraeus.test")
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
        assert "strict-transport-security" not in answer.headers
    assert own.headers["content-security-policy"] == "default-src 'none'"


async def test_over_tls_browsers_are_told_to_stay_on_it() -> None:
    async with client("https://astraeus.test") as c:
        answer = await c.get("/nowhere")
    assert answer.headers["strict-transport-security"] == "max-age=31536000"


def test_the_policy_names_the_websocket_origin_only_when_the_host_is_a_host() -> None:
    assert "connect-src 'self' ws://h:8080 wss://h:8080;" in content_security_policy("h:8080")
    assert "connect-src 'self' ws://[::1]:80 wss://[::1]:80;" in content_security_policy("[::1]:80")
    for hostile in ("h; script-src *", "evil.com 'unsafe-inline'", "", None):
        assert "connect-src 'self';" in content_security_policy(hostile)
    assert "script-src 'self';" in content_security_policy(None)
