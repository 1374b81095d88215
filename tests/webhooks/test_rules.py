"""The webhook rules, pure: what a subscription may say, the body and its signature, the
backoff, and how far the cursor may move."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta

import pytest

from backend.errors import FieldError
from backend.events.rules import SETTLE, Cursor, EventView, advance
from backend.webhooks import rules
from backend.webhooks.rules import DeliveryStatus
from tests.support import SEED_TIME

NOW = SEED_TIME


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://hooks.example.com/astraeus?team=ml", None),
        ("http://127.0.0.1:8080/hook", None),
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
    content = rules.body(event)
    assert (
        content
        == (
            '{"id":42,"kind":"worker.state","state":"Failed","reason":"Exited with code 1 — OOM?",'
            '"run":"llama-sft","worker":"llama-sft-1","workspace":"default",'
            '"created_at":"2026-10-01T01:02:11.402117Z","data":{"exit_code":1}}'
        ).encode()
    )
    expected = hmac.new(b"whsec_k", content, hashlib.sha256).hexdigest()
    assert rules.headers(event, "whsec_k", content) == {
        "Content-Type": "application/json",
        "User-Agent": "astraeus-webhooks",
        "X-Astraeus-Event-Id": "42",
        "X-Astraeus-Event-Kind": "worker.state",
        "X-Astraeus-Signature": f"sha256={expected}",
    }


def test_backoff_doubles_from_ten_seconds_up_to_an_hour() -> None:
    waits = [rules.backoff(n).total_seconds() for n in range(1, 13)]
    assert waits == [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600, 3600]


def test_an_attempt_delivers_on_2xx_only() -> None:
    for status in (200, 202, 204, 299):
        done = rules.after_attempt(2, status, None, "HTTP 500", NOW)
        assert (done.attempts, done.delivered_at, done.last_status, done.last_error) == (
            2,
            NOW,
            status,
            "HTTP 500",  # what failed before stays readable
        )
    for status in (199, 301, 404, 500):
        failed = rules.after_attempt(2, status, None, None, NOW)
        assert (failed.attempts, failed.delivered_at, failed.last_error) == (
            3,
            None,
            f"HTTP {status}",
        )
        assert failed.next_attempt_at == NOW + timedelta(seconds=40)
    refused = rules.after_attempt(0, None, "connection refused", None, NOW)
    assert (refused.attempts, refused.last_status, refused.last_error) == (
        1,
        None,
        "connection refused",
    )


def test_the_twelfth_failure_gives_up() -> None:
    eleventh = rules.after_attempt(10, 500, None, None, NOW)
    assert (eleventh.attempts, eleventh.gave_up_at) == (11, None)
    twelfth = rules.after_attempt(11, 500, None, None, NOW)
    assert (twelfth.attempts, twelfth.gave_up_at, twelfth.last_error) == (12, NOW, "HTTP 500")
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
