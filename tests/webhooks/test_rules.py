"""The webhook rules, pure: what a subscription may say, the body and its signature, the
backoff, and how far the cursor may move."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta

import pytest

from backend.config import parse_networks
from backend.errors import FieldError
from backend.events.rules import SETTLE, Cursor, EventView, advance
from backend.webhooks import rules
from backend.webhooks.addresses import Policy
from backend.webhooks.rules import DeliveryStatus, Head
from tests.support import SEED_TIME

NOW = SEED_TIME


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://hooks.example.com/astraeus?team=ml", None),
        ("http://93.184.215.14:8080/hook", None),
        ("http://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/hook", None),
        ("HTTPS://Example.com", None),
        ("", "is required"),
        ("   ", "is required"),
        ("ftp://example.com/hook", "must be an http:// or https:// URL"),
        ("example.com/hook", "must be an http:// or https:// URL"),
        ("javascript:alert(1)", "must be an http:// or https:// URL"),
        ("https://", "must name a host"),
        ("https:///path-only", "must name a host"),
        ("https://example.com:99999/", "is not a valid URL"),
        ("https://example.com:port/", "is not a valid URL"),
        ("https://exa mple.com/", "must not contain spaces or control characters"),
        ("https://example.com/\n", "must not contain spaces or control characters"),
        ("https://example.com/" + "a" * 2029, "must be at most 2048 characters"),
    ],
)
def test_urls(url: str, problem: str | None) -> None:
    assert rules.check_url(url) == problem


INSIDE = "refused: private address (loopback, link-local and private ones only if allowed)"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:5432/",
        "http://127.0.0.1:6379/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/",
        "http://0x7f000001/",
        "http://2130706433/",
        "http://127.1/",
        "http://0177.0.0.1/",
        "http://10.0.0.5/hook",
        "http://172.16.3.4/hook",
        "http://192.168.1.1/hook",
        "http://100.64.0.1/hook",
        "http://0.0.0.0:8080/",
        "http://224.0.0.1/",
        "http://[fe80::1]/",
        "http://[fd00::2]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:a9fe:a9fe]/",
        "http://localhost:8080/",
        "http://api.localhost/",
        "https://LOCALHOST./",
    ],
)
def test_urls_naming_an_address_inside_are_refused(url: str) -> None:
    assert rules.check_url(url) == INSIDE


def test_an_admins_allow_list_lets_its_networks_through() -> None:
    allowed = Policy(allow=parse_networks("10.20.0.0/16,127.0.0.1"), own_ports=frozenset({8080}))
    assert rules.check_url("http://10.20.3.4/hook", allowed) is None
    assert rules.check_url("http://127.0.0.1:9000/hook", allowed) is None
    assert rules.check_url("http://localhost:9000/hook", allowed) is None
    assert rules.check_url("http://10.21.0.1/hook", allowed) == INSIDE
    assert rules.check_url("http://127.0.0.2:9000/hook", allowed) == INSIDE
    # the server's own port, allowed or not
    assert rules.check_url("http://127.0.0.1:8080/graphql", allowed) == INSIDE


def test_the_longest_url_is_accepted() -> None:
    url = "https://example.com/" + "a" * 2028
    assert len(url) == 2048 and rules.check(url, []) == []


def test_kinds_are_checked_one_by_one() -> None:
    assert rules.check("https://example.com", ["alert", "run.state", "worker.state"]) == []
    reason = (
        "must be an event kind or the start of one, such as 'alert' or 'run.state': lowercase "
        "words joined by '.', at most 32 characters"
    )
    assert rules.check("ftp://x", ["alert", "Alert", "alert.", "", "a" * 33]) == [
        FieldError("url", "must be an http:// or https:// URL"),
        FieldError("kinds[1]", reason),
        FieldError("kinds[2]", reason),
        FieldError("kinds[3]", reason),
        FieldError("kinds[4]", reason),
    ]
    assert rules.check("https://x", [f"k{i}" for i in range(21)]) == [
        FieldError("kinds", "must name at most 20 kinds")
    ]


def test_the_body_and_its_signature() -> None:
    event = EventView(
        id=42,
        kind="worker.state",
        state="Failed",
        reason="Exited with code 1 — OOM?",
        run="llama-sft",
        worker="llama-sft-1",
        workspace="default",
        created_at=NOW,
        data={"exit_code": 1},
    )
    content = rules.body(event, "Z3lS0Nbz6fntndMhehv97A")  # its id as the API shows it
    assert (
        content
        == (
            '{"id":"Z3lS0Nbz6fntndMhehv97A",'
            '"kind":"worker.state","state":"Failed","reason":"Exited with code 1 — OOM?",'
            '"run":"llama-sft","worker":"llama-sft-1","workspace":"default",'
            '"created_at":"2026-10-01T01:02:11.402117Z","found_at":"2026-10-01T01:02:11.402117Z",'
            '"data":{"exit_code":1}}'
        ).encode()
    )
    # t: the attempt's time in whole seconds; v1: HMAC-SHA256 of "<t>.<body>"
    t = 1790816531
    assert int(NOW.timestamp()) == t
    expected = hmac.new(b"whsec_k", f"{t}.".encode() + content, hashlib.sha256).hexdigest()
    assert rules.headers("Z3lS0Nbz6fntndMhehv97A", event.kind, "whsec_k", content, NOW) == {
        "Content-Type": "application/json",
        "User-Agent": "astraeus-webhooks",
        "X-Astraeus-Event-Id": "Z3lS0Nbz6fntndMhehv97A",
        "X-Astraeus-Event-Kind": "worker.state",
        "X-Astraeus-Signature": f"t={t},v1={expected}",
    }
    later = rules.signature("whsec_k", content, NOW + timedelta(seconds=10))
    assert later.startswith(f"t={t + 10},v1=") and later != f"t={t},v1={expected}"


def test_backoff_doubles_from_ten_seconds_up_to_an_hour() -> None:
    waits = [rules.backoff(n).total_seconds() for n in range(1, 13)]
    assert waits == [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600, 3600]


def test_an_attempt_delivers_on_2xx_only() -> None:
    for status in (200, 202, 204, 299):
        done = rules.after_attempt(2, status, None, "failed: HTTP 500", NOW)
        assert (done.attempts, done.delivered_at, done.last_status, done.last_error) == (
            2,
            NOW,
            status,
            "failed: HTTP 500",  # what failed before stays readable
        )
    for status in (199, 301, 404, 500):
        failed = rules.after_attempt(2, status, None, None, NOW)
        assert (failed.attempts, failed.delivered_at, failed.last_error) == (
            3,
            None,
            f"failed: HTTP {status}",
        )
        assert failed.next_attempt_at == NOW + timedelta(seconds=40)
    for why in ("failed", "refused: private address"):
        refused = rules.after_attempt(0, None, why, None, NOW)
        assert (refused.attempts, refused.last_status, refused.last_error) == (1, None, why)


def test_the_twelfth_failure_gives_up() -> None:
    eleventh = rules.after_attempt(10, 500, None, None, NOW)
    assert (eleventh.attempts, eleventh.gave_up_at) == (11, None)
    twelfth = rules.after_attempt(11, 500, None, None, NOW)
    assert (twelfth.attempts, twelfth.gave_up_at, twelfth.last_error) == (
        12,
        NOW,
        "failed: HTTP 500",
    )
    assert rules.status(None, NOW, 12) is DeliveryStatus.GAVE_UP
    assert rules.status(NOW, None, 3) is DeliveryStatus.DELIVERED
    assert rules.status(None, None, 3) is DeliveryStatus.RETRYING
    assert rules.status(None, None, 0) is DeliveryStatus.PENDING


def test_the_cursor_moves_to_a_horizon_once_it_has_settled() -> None:
    fresh = Cursor(cursor=10, horizon=10, horizon_at=None)
    seen = advance(fresh, 15, NOW)
    assert seen == Cursor(10, 15, NOW)  # looked at up to 15; not moved yet
    later = NOW + timedelta(seconds=59)
    assert advance(seen, 20, later) == seen
    settled = NOW + SETTLE
    assert advance(seen, 20, settled) == Cursor(15, 20, settled)
    # A pass that looked at fewer (its batch was full) moves no further than it looked.
    assert advance(seen, 12, settled) == Cursor(12, 12, settled)
    # Nothing new: it stays.
    assert advance(Cursor(15, 15, NOW), 15, settled) == Cursor(15, 15, settled)


def head(webhook: int, workspace: int, waited_s: float) -> Head:
    return Head(webhook, workspace, webhook * 10, NOW - timedelta(seconds=waited_s))


def test_workspaces_take_turns_each_under_its_cap() -> None:
    # workspace 1 has 40 webhooks due, waiting longest; 2 and 3 one each
    heads = [head(w, 1, 100 - w) for w in range(1, 41)] + [head(50, 2, 5), head(60, 3, 1)]
    taken = rules.fair_share(heads, {}, room=64)
    assert [(h.workspace_id, h.webhook_id) for h in taken] == [
        (1, 1),
        (2, 50),
        (3, 60),
        (1, 2),
        (1, 3),
        (1, 4),
    ]
    # with 3 of workspace 1's already out, one more of it; little room: one each in turn
    assert [h.webhook_id for h in rules.fair_share(heads, {1: 3}, room=64)] == [1, 50, 60]
    assert [h.webhook_id for h in rules.fair_share(heads, {1: 4}, room=64)] == [50, 60]
    assert [h.webhook_id for h in rules.fair_share(heads, {}, room=2)] == [1, 50]
    assert rules.fair_share(heads, {}, room=0) == []
    assert rules.WORKSPACE_IN_FLIGHT == 4
