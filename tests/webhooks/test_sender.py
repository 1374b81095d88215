"""One attempt over the network: the host resolved now, every address it has checked, the
request sent to the address checked (a name that changes its answer between the check and
the connection reaches nothing inside), and nothing of what answered told to the user.

The resolver is the outside world's DNS: the tests give names answers of their own."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from backend.config import parse_networks
from backend.webhooks import rules
from backend.webhooks.addresses import IPAddress, Policy
from backend.webhooks.sender import Outgoing, sending
from tests.certificates import Authority
from tests.support import FakeClock, free_port
from tests.webhooks.receiver import receiving


class Dns:
    """Answers a name with the next list of addresses it was given (the last one for good)."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = [list(a) for a in answers]
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        from ipaddress import ip_address

        self.asked.append((host, port))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [ip_address(a) for a in answer]


def outgoing(url: str) -> Outgoing:
    return Outgoing(
        delivery_id=1,
        webhook_id=1,
        event_id="Z3lS0Nbz6fntndMhehv97A",
        kind="run.state",
        attempts=0,
        last_error=None,
        url=url,
        secret="whsec_k",
        body=b'{"id":7}',
    )


@contextmanager
def banner(host: str, text: bytes) -> Iterator[tuple[str, list[bytes]]]:
    """A server that is not HTTP: it says ``text`` to whoever connects (as Redis or SSH do);
    its URL, and what it was sent."""
    listener = socket.create_server((host, 0))
    heard: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    heard.append(conn.recv(65536))
                    conn.sendall(text)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{listener.getsockname()[1]}/", heard
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join()


async def test_the_request_goes_to_the_address_that_was_checked() -> None:
    # rebind.example answers an allowed address to the check, then loopback: the request
    # still goes to the address checked, with the name as its Host
    port = free_port()
    clock = FakeClock()
    with receiving("127.0.0.2", port) as checked, receiving("127.0.0.1", port) as decoy:
        dns = Dns(["127.0.0.2"], ["127.0.0.1"])
        policy = Policy(allow=parse_networks("127.0.0.2"))
        async with sending(policy, clock, dns) as sender:
            sent = await sender.send(outgoing(f"http://rebind.example:{port}/hook"))
    assert (sent.status, sent.error) == (204, None)
    assert dns.asked == [("rebind.example", port)]
    assert decoy.received == []
    [request] = checked.received
    assert request.path == "/hook"
    assert request.headers["host"] == f"rebind.example:{port}"
    t = int(clock.now().timestamp())
    assert request.headers["x-astraeus-signature"].startswith(f"t={t},v1=")


async def test_a_name_with_any_address_inside_is_refused_without_connecting() -> None:
    port = free_port()
    with receiving("127.0.0.1", port) as decoy:
        for answer in (["127.0.0.1"], ["93.184.215.14", "127.0.0.1"], ["::1"], ["10.1.2.3"]):
            async with sending(Policy(), FakeClock(), Dns(answer)) as sender:
                sent = await sender.send(outgoing(f"http://hooks.example:{port}/"))
            assert (sent.status, sent.error) == (None, "refused: private address"), answer
    assert decoy.received == []


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "0x7f000001",
        "2130706433",
        "127.1",
        "0177.0.0.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "localhost",
    ],
)
async def test_loopback_written_any_way_is_refused(host: str) -> None:
    port = free_port()
    dns = Dns(["127.0.0.1"])  # what the system resolver says of localhost
    with receiving("127.0.0.1", port) as decoy:
        async with sending(Policy(), FakeClock(), dns) as sender:
            sent = await sender.send(outgoing(f"http://{host}:{port}/"))
    assert (sent.status, sent.error) == (None, "refused: private address")
    assert decoy.received == []
    assert dns.asked == ([("localhost", port)] if host == "localhost" else [])


async def test_the_servers_own_port_is_refused_even_where_loopback_is_allowed() -> None:
    port = free_port()
    with receiving("127.0.0.1", port) as itself:
        policy = Policy(allow=parse_networks("127.0.0.0/8"), own_ports=frozenset({port}))
        async with sending(policy, FakeClock(), Dns(["127.0.0.1"])) as sender:
            for url in (f"http://127.0.0.1:{port}/graphql", f"http://astraeus.example:{port}/"):
                sent = await sender.send(outgoing(url))
                assert (sent.status, sent.error) == (None, "refused: private address")
    assert itself.received == []


async def test_what_answered_is_never_told() -> None:
    # Redis's answer to a POST, a closed port, a name no one knows: each just "failed"
    allowed = Policy(allow=parse_networks("127.0.0.0/8"))
    redis_error = b"-ERR unknown command 'POST', with args beginning with: secret-key\r\n"
    with banner("127.0.0.1", redis_error) as (url, heard):
        async with sending(allowed, FakeClock(), Dns([])) as sender:
            redis = await sender.send(outgoing(url))
            unknown = await sender.send(outgoing("http://nowhere.example/"))
            closed = await sender.send(outgoing(f"http://127.0.0.1:{free_port()}/"))
    assert heard and heard[0].startswith(b"POST / HTTP/1.1")  # it was reached
    for sent in (redis, unknown, closed):
        assert (sent.status, sent.error) == (None, "failed")


def test_a_signature_names_its_time() -> None:
    at = datetime(2026, 10, 1, 1, 2, 11, 900000, tzinfo=UTC)
    assert rules.signature("whsec_k", b"{}", at).startswith("t=1790816531,v1=")


async def test_tls_is_verified_for_the_name_though_the_address_is_connected(
    tmp_path: Path,
) -> None:
    authority = Authority.make("webhooks-test-ca")
    cert, key = authority.issue(tmp_path, "hooks.test")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    trusted = ssl.create_default_context(cafile=authority.write(tmp_path))
    policy = Policy(allow=parse_networks("127.0.0.2"))
    with receiving("127.0.0.2", tls=server) as receiver:
        port = receiver.url.split(":")[2].split("/")[0]
        async with sending(policy, FakeClock(), Dns(["127.0.0.2"]), trusted) as sender:
            named = await sender.send(outgoing(f"https://hooks.test:{port}/hook"))
            # the same address under another name: its certificate is not that name's
            other = await sender.send(outgoing(f"https://other.test:{port}/hook"))
    assert (named.status, named.error) == (204, None)
    assert (other.status, other.error) == (None, "failed")
    [request] = receiver.received
    assert request.headers["host"] == f"hooks.test:{port}"
