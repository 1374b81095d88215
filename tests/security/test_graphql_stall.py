"""Issue 37 N1, played live: one GraphQL request must not stall the server. `astraeus up` (a
real uvicorn server in its own process) is sent documents whose cost is in their expansion,
ten at a time, unauthenticated and with a token, while another client times /healthz.

Before issue 37: a 925-byte document of nested fragments (each spreading the previous twice)
blocked the event loop 16-51 s; a document of 20 such fragments was answered *with data*,
unauthenticated, after 5 s, and /healthz waited as long; an 810-byte document of overlapping
aliases was refused after 3-4 s. Validation ran before authentication, on the event loop, and
walked every fragment's expansion (the depth and alias rules did).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.live import Server, serving
from tests.support.graphql_attacks import (
    ATTACKS,
    HEALTHZ_S,
    HEAVIEST_ALLOWED,
    SENDERS,
    Measured,
    attack,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("stall")
    # No agent: what is measured is the API's event loop. Bodies up to 2 MiB: the megabyte of
    # commas reaches GraphQL (by default its body is refused unread, with 413).
    with serving(root / "data", local_agent=False, max_body_bytes=str(2 * 2**20)) as (s, _):
        yield s


@pytest.fixture(scope="module")
def bob(server: Server) -> str:
    """A member's token of a second workspace, team-b."""
    server.cli("workspace", "create", "team-b")
    return server.cli("token", "create", "--workspace", "team-b", "--user", "bob").split()[-1]


def test_every_attack_is_refused_unauthenticated_before_it_is_parsed(server: Server) -> None:
    # issue 37 N1: anonymous documents were parsed and validated before the token was looked at
    measured = attack(server.url, None, {name: query for name, (query, _) in ATTACKS.items()})
    assert len(measured.answers) == SENDERS * len(ATTACKS)
    for name, status, body in measured.answers:
        assert status == 200, (name, body)
        assert body == {
            "data": None,
            "errors": [
                {
                    "message": "A valid API token is required: send 'Authorization: Bearer "
                    "<token>'.",
                    "extensions": {"code": "UNAUTHENTICATED"},
                }
            ],
        }, (name, body)
    assert max(measured.healthz) < HEALTHZ_S, sorted(measured.healthz)[-5:]


def test_every_attack_is_refused_with_a_token_naming_its_bound(server: Server) -> None:
    # issue 37 N1: with a token, each document is measured (fragments counted once each) and
    # refused by the bound it passes, off the event loop, while /healthz answers
    measured = attack(
        server.url, server.admin_token, {name: query for name, (query, _) in ATTACKS.items()}
    )
    assert len(measured.answers) == SENDERS * len(ATTACKS)
    for name, status, body in measured.answers:
        assert status == 200, (name, body)
        assert body.get("data") is None, (name, body)
        assert ATTACKS[name][1] in body["errors"][0]["message"], (name, body)
    assert max(measured.healthz) < HEALTHZ_S, sorted(measured.healthz)[-5:]


def test_the_heaviest_documents_allowed_are_checked_in_turn_and_stall_no_one(
    server: Server, bob: str
) -> None:
    # issue 37 N1: what passes the bounds is validated in a checking thread within a deadline,
    # one document of a workspace at a time: another workspace's new document waits for none
    # of them, and /healthz for nothing
    flooding: list[Measured] = []
    flood = threading.Thread(
        target=lambda: flooding.append(
            attack(server.url, server.admin_token, {"heaviest": HEAVIEST_ALLOWED}, rounds=2)
        )
    )
    team_b = {"Authorization": f"Bearer {bob}"}
    waited = []
    with httpx.Client(timeout=60) as client:
        flood.start()
        time.sleep(1)  # the flood under way
        for i in range(10):
            started = time.monotonic()
            answer = client.post(
                f"{server.url}/graphql",
                json={"query": f"query B{i} {{ viewer {{ user workspace }} }}"},
                headers=team_b,
            )
            waited.append(time.monotonic() - started)
            assert answer.json() == {"data": {"viewer": {"user": "bob", "workspace": "team-b"}}}
        flood.join()
    assert max(waited) < HEALTHZ_S, waited
    [measured] = flooding
    overdue = {
        "data": None,
        "errors": [
            {
                "message": "The request could not be checked within 5 s (the server is busy "
                "checking others); try again.",
                "extensions": {"code": "TIME_BUDGET_EXCEEDED"},
            }
        ],
    }
    answered = [body for _, _, body in measured.answers if body != overdue]
    assert answered and all(body == {"data": {"viewer": {"user": "admin"}}} for body in answered)
    assert max(measured.healthz) < HEALTHZ_S, sorted(measured.healthz)[-5:]
