"""Webhooks, pure: what a subscription may say, what is sent and how it is signed, when a
failed delivery is tried again, and how far a webhook's cursor may move.

Delivery is at least once and in order: a webhook has one delivery in flight at a time, its
oldest (by event id) not yet delivered or given up; the next waits until it is. Delivery is
at least once: a delivery is marked delivered only after a 2xx answer, so a
receiver may get an event twice (a pass that died between the answer and the record) and
dedupes by the event id it is sent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from urllib.parse import SplitResult, urlsplit

from backend.errors import FieldError
from backend.events.rules import EventView
from backend.webhooks import addresses
from backend.webhooks.addresses import Policy

MAX_URL_LENGTH = 2048
MAX_KINDS = 20
KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
KIND_LENGTH = 32  # events.kind

MAX_ATTEMPTS = 12
FIRST_BACKOFF = timedelta(seconds=10)
MAX_BACKOFF = timedelta(hours=1)
TIMEOUT_S = 5.0  # an attempt's whole time: resolving, connecting, sending, the answer's head
# Deliveries of one workspace in flight at once (each to a webhook of its own): however many
# webhooks a workspace has that never answer, the others' deliveries go out beside them.
WORKSPACE_IN_FLIGHT = 4
# How old a signature's timestamp a receiver should accept (see ``signature``).
REPLAY_WINDOW = timedelta(minutes=5)
# A pass claims the deliveries it sends for this long: none is sent twice at once, and one
# whose pass died is sent again when the claim runs out.
CLAIM = timedelta(minutes=1)

USER_AGENT = "astraeus-webhooks"


class DeliveryStatus(Enum):
    PENDING = "pending"  # not tried yet
    RETRYING = "retrying"  # failed; tried again at next_attempt_at
    DELIVERED = "delivered"  # the receiver answered 2xx
    GAVE_UP = "gave_up"  # failed MAX_ATTEMPTS times


def check(url: str, kinds: list[str], policy: Policy | None = None) -> list[FieldError]:
    """Why a subscription is refused, field by field (nothing: it is accepted).

    A kind names events of that kind and of the kinds under it: 'alert' is alert.firing and
    alert.resolved, 'run.state' only run.state; no kinds is every kind."""
    problems = []
    url_problem = check_url(url, policy or Policy())
    if url_problem is not None:
        problems.append(FieldError("url", url_problem))
    if len(kinds) > MAX_KINDS:
        problems.append(FieldError("kinds", f"must name at most {MAX_KINDS} kinds"))
    for i, kind in enumerate(kinds):
        if len(kind) > KIND_LENGTH or not KIND_PATTERN.match(kind):
            problems.append(
                FieldError(
                    f"kinds[{i}]",
                    "must be an event kind or the start of one, such as 'alert' or "
                    f"'run.state': lowercase words joined by '.', at most {KIND_LENGTH} "
                    "characters",
                )
            )
    return problems


def check_url(url: str, policy: Policy | None = None) -> str | None:
    if not url.strip():
        return "is required"
    if len(url) > MAX_URL_LENGTH:
        return f"must be at most {MAX_URL_LENGTH} characters"
    if any(c.isspace() or not c.isprintable() for c in url):
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        return "is not a valid URL"
    if parts.scheme.lower() not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must name a host"
    if addresses.obviously_inside(parts.hostname, port_of(parts), policy or Policy()):
        return f"{addresses.REFUSED} (loopback, link-local and private ones only if allowed)"
    return None


def port_of(parts: SplitResult) -> int:
    return parts.port or (443 if parts.scheme.lower() == "https" else 80)


def body(event: EventView, shown_id: str) -> bytes:
    """The JSON sent, once: the signature is of these exact bytes. ``shown_id``: the event's
    id as the API shows it."""
    return json.dumps(event.to_json(shown_id), separators=(",", ":"), ensure_ascii=False).encode()


def signature(secret: str, content: bytes, sent_at: datetime) -> str:
    """``t=<unix seconds>,v1=<hex>``: the time of the attempt, and the HMAC-SHA256 with the
    webhook's secret of ``<t>.<body>``. A receiver recomputes v1 over the t it was given and
    the raw body, compares in constant time, and refuses a t older than REPLAY_WINDOW: a
    request recorded on the way cannot be played to it again later."""
    t = int(sent_at.timestamp())
    mac = hmac.new(secret.encode(), f"{t}.".encode() + content, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def headers(
    event_id: str, kind: str, secret: str, content: bytes, sent_at: datetime
) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Astraeus-Event-Id": event_id,
        "X-Astraeus-Event-Kind": kind,
        "X-Astraeus-Signature": signature(secret, content, sent_at),
    }


def backoff(failed_attempts: int) -> timedelta:
    """The wait after the n-th failed attempt: 10 s, doubling, at most an hour."""
    return min(FIRST_BACKOFF * 2 ** (failed_attempts - 1), MAX_BACKOFF)


@dataclass(frozen=True)
class Outcome:
    """A delivery after one attempt."""

    attempts: int
    next_attempt_at: datetime
    delivered_at: datetime | None
    gave_up_at: datetime | None
    last_status: int | None
    last_error: str | None


# Why an attempt failed, as its users read it: the receiver's HTTP status at most, never what
# else answered there (a banner, a body, how a connection failed: a port scan's answers).
FAILED = "failed"
REFUSED = addresses.REFUSED


def after_attempt(
    attempts: int, status: int | None, error: str | None, last_error: str | None, now: datetime
) -> Outcome:
    """A 2xx delivers it; anything else (another status, no answer: ``error``, FAILED or
    REFUSED) is a failed attempt, tried again after the backoff, given up at the
    MAX_ATTEMPTS-th."""
    if error is None and status is not None and 200 <= status < 300:
        return Outcome(attempts, now, now, None, status, last_error)
    failed = attempts + 1
    why = error or f"{FAILED}: HTTP {status}"
    if failed >= MAX_ATTEMPTS:
        return Outcome(failed, now, None, now, status, why)
    return Outcome(failed, now + backoff(failed), None, None, status, why)


@dataclass(frozen=True)
class Head:
    """A webhook's oldest delivery not yet settled: the only one of it that may be sent."""

    webhook_id: int
    workspace_id: int
    delivery_id: int
    due_at: datetime


def fair_share(
    heads: Sequence[Head],
    in_flight: Mapping[int, int],
    room: int,
    cap: int = WORKSPACE_IN_FLIGHT,
) -> list[Head]:
    """The due heads to send now, at most ``room``: a workspace at a time in turn (the one
    waiting longest first), each workspace's longest-waiting first, none past its ``cap``
    of deliveries in flight (``in_flight``: by workspace id, those already out)."""
    queues: dict[int, deque[Head]] = {}
    for head in sorted(heads, key=lambda h: (h.due_at, h.webhook_id)):
        queues.setdefault(head.workspace_id, deque()).append(head)
    out = dict(in_flight)
    taken: list[Head] = []
    while queues and len(taken) < room:
        for workspace in list(queues):
            queue = queues[workspace]
            if not queue or out.get(workspace, 0) >= cap:
                del queues[workspace]
                continue
            if len(taken) == room:
                break
            taken.append(queue.popleft())
            out[workspace] = out.get(workspace, 0) + 1
    return taken


def status(
    delivered_at: datetime | None, gave_up_at: datetime | None, attempts: int
) -> DeliveryStatus:
    if delivered_at is not None:
        return DeliveryStatus.DELIVERED
    if gave_up_at is not None:
        return DeliveryStatus.GAVE_UP
    return DeliveryStatus.RETRYING if attempts else DeliveryStatus.PENDING
