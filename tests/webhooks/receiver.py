"""A real HTTP receiver on a free loopback port, in a thread: what webhooks are sent to in
the tests. It keeps every request and answers each with the next status it is told to.
Loopback is inside: the tests allow it as an admin would (ASTRAEUS_WEBHOOK_ALLOW).

And a receiver that never answers: it takes each connection and says nothing."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from backend.ids import Kind
from tests.support.ids import opened


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def event_id(self) -> int:
        """The event's number in the database behind the id it was sent with."""
        return opened(Kind.EVENT, self.headers["x-astraeus-event-id"])


@dataclass
class Receiver:
    url: str
    # Statuses to answer with, in order; once used up, `then` for every request.
    statuses: list[int] = field(default_factory=list)
    then: int = 204
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: threading.Event = field(default_factory=threading.Event)  # a first request came

    def answer(self) -> int:
        with self.lock:
            return self.statuses.pop(0) if self.statuses else self.then

    def keep(self, request: Received) -> None:
        with self.lock:
            self.received.append(request)
        self.arrived.set()

    @property
    def by_id(self) -> list[Received]:
        """What it got, by event id: a batch is sent all at once, in no promised order."""
        with self.lock:
            return sorted(self.received, key=lambda r: r.event_id)

    @property
    def event_ids(self) -> list[int]:
        return [r.event_id for r in self.by_id]


@contextmanager
def receiving(
    host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None
) -> Iterator[Receiver]:
    """Listening until the block ends (over TLS with ``tls``, a server context)."""
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            content = self.rfile.read(length)
            receiver.keep(
                Received(self.path, {k.lower(): v for k, v in self.headers.items()}, content)
            )
            self.send_response(receiver.answer())
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # a pass opens many connections at once

    server = Server((host, port), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls else "http"
    receiver = Receiver(url=f"{scheme}://{host}:{server.server_address[1]}/hooks/astraeus")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass
class Stalling:
    url: str
    connections: list[socket.socket] = field(default_factory=list)


@contextmanager
def stalling(host: str = "127.0.0.1") -> Iterator[Stalling]:
    """Accepts every connection, reads nothing, answers nothing, until the block ends."""
    listener = socket.create_server((host, 0), backlog=256)
    stalled = Stalling(url=f"http://{host}:{listener.getsockname()[1]}/never")

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            stalled.connections.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield stalled
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join()
        for conn in stalled.connections:
            conn.close()
