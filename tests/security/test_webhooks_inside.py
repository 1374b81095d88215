"""Issue 18's webhook attacks, played live: `astraeus up`, its own workspace and team-b with a
member token, webhooks aimed inside, and one workspace's receivers that never answer.

Before issue 18 `createWebhook` took PostgreSQL's, Redis's and the server's own ports on
loopback, 169.254.169.254, [::1] and 0x7f000001, and each delivery's lastError told the user
what answered there; signatures carried no time; and forty webhooks to a URL that never
answers held every other workspace's deliveries back for over a minute (one global queue).

This server's admin allows one loopback address, 127.0.0.2 (ASTRAEUS_WEBHOOK_ALLOW), where
the tests' receivers listen: loopback is reached only through the allow-list."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.e2e.live import Api, Server, running
from tests.webhooks.receiver import receiving, stalling

ALLOWED = "127.0.0.2"
INSIDE = "refused: private address (loopback, link-local and private ones only if allowed)"
CREATE = """mutation($url: String!) {
  createWebhook(url: $url) { webhook { id } secret errors { field message } }
}"""
LIST = "{ webhooks { id url deliveries { eventId status attempts lastStatus lastError } } }"
RUN = "mutation($s: JSON!) { createRun(spec: $s) { errors { field message } } }"


class Client(Api):
    def create(self, url: str) -> dict[str, Any]:
        return dict(self.graphql(CREATE, url=url)["createWebhook"])

    def webhooks(self) -> list[dict[str, Any]]:
        return list(self.graphql(LIST)["webhooks"])

    def submit(self, name: str) -> None:
        """A run: its events (run created, its worker pending) go to the webhooks."""
        spec = {"name": name, "gpus": 1, "command": ["python", "-c", "pass"]}
        assert self.graphql(RUN, s=spec)["createRun"]["errors"] == []


class Cluster:
    def __init__(self, server: Server, default: Client, team_b: Client) -> None:
        self.server, self.default, self.team_b = server, default, team_b

    @property
    def port(self) -> int:
        return int(self.server.url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("webhooks-inside")
    with running(root / "data", local_agent=False, webhook_allow=f"{ALLOWED}/32") as (
        server,
        admin,
    ):
        server.cli("workspace", "create", "team-b")
        bob = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]
        yield Cluster(server, Client(server, admin), Client(server, bob))


def wait_for(what: str, check: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds}s for {what}"
        time.sleep(0.2)


@contextmanager
def banner(host: str, text: bytes) -> Iterator[str]:
    """Not HTTP: says ``text`` to whoever connects, as Redis answers a POST."""
    listener = socket.create_server((host, 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(text)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{listener.getsockname()[1]}/"
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join()


def test_webhooks_to_addresses_inside_are_refused(cluster: Cluster) -> None:
    for url in (
        "http://127.0.0.1:5432/",  # PostgreSQL
        "http://127.0.0.1:6379/",  # Redis
        f"http://127.0.0.1:{cluster.port}/graphql",  # the server itself
        f"http://{ALLOWED}:{cluster.port}/graphql",  # its port, even where loopback is allowed
        "http://169.254.169.254/latest/meta-data/",
        f"http://[::1]:{cluster.port}/",
        f"http://0x7f000001:{cluster.port}/",
        "http://2130706433:6379/",
        "http://127.1:5432/",
        "http://[::ffff:127.0.0.1]:6379/",
        "http://10.0.0.5/hook",
        "http://localhost:6379/",
    ):
        assert cluster.default.create(url) == {
            "webhook": None,
            "secret": None,
            "errors": [{"field": "url", "message": INSIDE}],
        }, url
    assert cluster.default.webhooks() == []


def test_a_name_that_resolves_inside_is_refused_when_sent_and_nothing_is_told(
    cluster: Cluster,
) -> None:
    host = socket.gethostname()
    resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    if all(ipaddress.ip_address(a).is_global for a in resolved):
        pytest.skip(f"{host} resolves to no address inside")
    redis = b"-ERR unknown command 'POST', with args beginning with: \r\n"
    with banner(ALLOWED, redis) as not_http:
        closed = socket.socket()
        closed.bind((ALLOWED, 0))
        closed_url = f"http://{ALLOWED}:{closed.getsockname()[1]}/"
        closed.close()
        urls = {
            f"http://{host}:5432/": "refused: private address",
            f"http://{host}:6379/": "refused: private address",
            f"http://{host}:{cluster.port}/graphql": "refused: private address",
            not_http: "failed",  # allowed, reached: what it said is not told
            closed_url: "failed",  # allowed, nothing listening: not told either
        }
        for url in urls:
            assert cluster.default.create(url)["errors"] == [], url
        cluster.default.submit("inside")

        def tried() -> bool:
            hooks = cluster.default.webhooks()
            return len(hooks) == len(urls) and all(
                h["deliveries"] and h["deliveries"][-1]["attempts"] >= 1 for h in hooks
            )

        wait_for("every webhook's first attempt", tried)
    for hook in cluster.default.webhooks():
        first = hook["deliveries"][-1]
        assert (first["status"], first["lastStatus"], first["lastError"]) == (
            "RETRYING",
            None,
            urls[hook["url"]],
        ), hook["url"]
        # in order: the rest wait behind the first
        assert all(d["attempts"] == 0 for d in hook["deliveries"][:-1])


def test_a_receiver_on_loopback_only_through_the_allow_list_and_signed_with_its_time(
    cluster: Cluster,
) -> None:
    with receiving("127.0.0.1") as outside_the_list, receiving(ALLOWED) as receiver:
        assert cluster.team_b.create(outside_the_list.url)["errors"] == [
            {"field": "url", "message": INSIDE}
        ]
        created = cluster.team_b.create(receiver.url)
        assert created["errors"] == []
        secret = created["secret"]
        cluster.team_b.submit("signed")
        wait_for("a delivery", lambda: len(receiver.received) >= 1)
        request = receiver.received[0]
    assert outside_the_list.received == []
    t, v1 = (part.split("=", 1)[1] for part in request.headers["x-astraeus-signature"].split(","))
    assert request.headers["x-astraeus-signature"] == f"t={t},v1={v1}"
    expected = hmac.new(secret.encode(), f"{t}.".encode() + request.body, hashlib.sha256)
    assert hmac.compare_digest(v1, expected.hexdigest())
    assert abs(time.time() - int(t)) < 300  # within the replay window
    assert request.json["workspace"] == "team-b"


def test_forty_stalled_webhooks_of_one_workspace_do_not_hold_back_anothers(
    cluster: Cluster,
) -> None:
    with stalling(ALLOWED) as stalled, receiving(ALLOWED) as receiver:
        for _ in range(40):
            assert cluster.default.create(stalled.url)["errors"] == []
        assert cluster.team_b.create(receiver.url)["errors"] == []
        cluster.default.submit("flood")
        wait_for("default's deliveries to stall", lambda: len(stalled.connections) >= 1)
        started = time.monotonic()
        cluster.team_b.submit("first")
        wait_for(
            "team-b's first delivery",
            lambda: any(r.json["run"] == "first" for r in receiver.received),
            seconds=10,
        )
        took = time.monotonic() - started
        assert took < 10

        def stalled_ones_recorded() -> bool:
            hooks = [h for h in cluster.default.webhooks() if h["url"] == stalled.url]
            heads = [h["deliveries"][-1] for h in hooks if h["deliveries"]]
            return sum(d["attempts"] >= 1 for d in heads) >= 4

        # the sending left going after each pass ends: 5 s on, each attempt is recorded, and
        # says nothing of how the receiver behaved
        wait_for("default's first attempts to time out", stalled_ones_recorded, seconds=30)
    tried = [
        h["deliveries"][-1]
        for h in cluster.default.webhooks()
        if h["url"] == stalled.url and h["deliveries"][-1]["attempts"]
    ]
    assert {(d["lastStatus"], d["lastError"]) for d in tried} == {(None, "failed")}
