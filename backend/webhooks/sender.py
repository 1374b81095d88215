"""One delivery's attempt, over the network: its host resolved now (every attempt, since
what a name points to may change), every address it has checked (backend/webhooks/
addresses.py), and the request sent to the address checked, never to the name again: a name
that answers a public address to the check and loopback to the connection (DNS rebinding)
reaches nothing inside. TLS still verifies the certificate for the name (SNI), and no proxy
from the environment is used.

What a user reads of an attempt is the receiver's HTTP status, or "failed", or "refused:
private address": never how a connection failed or what a receiver said."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from backend.clock import Clock
from backend.config import Settings
from backend.webhooks import addresses, rules
from backend.webhooks.addresses import IPAddress, Policy

log = logging.getLogger(__name__)

Resolve = Callable[[str, int], Awaitable[list[IPAddress]]]


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address the system's resolver gives the name (a resolver error: none)."""
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return [ipaddress.ip_address(str(info[4][0])) for info in found]


def policy_for(settings: Settings) -> Policy:
    """The admin's allow-list, this machine's addresses and the server's listening ports."""
    ports = frozenset(p for p in (settings.port, settings.agent_port) if p)
    return Policy(settings.webhook_allow, local_addresses(), ports)


@lru_cache(maxsize=1)
def local_addresses() -> frozenset[IPAddress]:
    """This machine's own addresses, from its interfaces (Linux; elsewhere none: loopback,
    private and link-local addresses are refused anyway)."""
    found: set[IPAddress] = set()
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):
                answer = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
                found.add(ipaddress.IPv4Address(answer[20:24]))
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            found.add(ipaddress.IPv6Address(int(line.split()[0], 16)))
    return frozenset(found)


@dataclass(frozen=True)
class Outgoing:
    """A delivery claimed by this pass, ready to send."""

    delivery_id: int
    webhook_id: int
    event_id: str  # as the API shows it (backend/ids.py)
    kind: str
    attempts: int
    last_error: str | None
    url: str
    secret: str = field(repr=False)
    body: bytes

    def headers(self, sent_at: datetime) -> dict[str, str]:
        """Signed at the attempt: a retry carries a timestamp of its own."""
        return rules.headers(self.event_id, self.kind, self.secret, self.body, sent_at)


@dataclass(frozen=True)
class Sent:
    """What one POST got: a status, or why there was none (rules.FAILED or REFUSED)."""

    delivery: Outgoing
    status: int | None
    error: str | None


class Sender:
    """Attempts of one pass, over one HTTP client (its connections are never reused across
    hosts: every request names an address)."""

    def __init__(self, client: httpx.AsyncClient, policy: Policy, clock: Clock, look_up: Resolve):
        self.client, self.policy, self.clock, self.look_up = client, policy, clock, look_up

    async def send(self, delivery: Outgoing) -> Sent:
        """POST it and return the status, or why there is none (rules.FAILED or REFUSED).
        Whatever a receiver does fails its own attempt, never the pass."""
        try:
            async with asyncio.timeout(rules.TIMEOUT_S):
                return await self._post(delivery)
        except Exception as error:  # kept from users; logged for the operator
            log.debug("webhook delivery %s failed: %r", delivery.delivery_id, error)
            return Sent(delivery, None, rules.FAILED)

    async def _post(self, delivery: Outgoing) -> Sent:
        # The address a host names by itself, read as the resolver reads it (before httpx,
        # which refuses some of those forms: they are refused here, not "failed").
        parts = urlsplit(delivery.url)
        port = rules.port_of(parts)
        named = addresses.literal(parts.hostname or "")
        if named is not None and addresses.refused(named, port, self.policy):
            return Sent(delivery, None, rules.REFUSED)
        url = httpx.URL(delivery.url)
        host = url.raw_host.decode("ascii")
        found = [named] if named is not None else await self.look_up(host, port)
        if not found:
            return Sent(delivery, None, rules.FAILED)
        if any(addresses.refused(a, port, self.policy) for a in found):
            return Sent(delivery, None, rules.REFUSED)
        headers = delivery.headers(self.clock.now()) | {"Host": url.netloc.decode("ascii")}
        extensions = {"sni_hostname": host} if url.scheme == "https" and named is None else {}
        # Streamed and never read: only the status counts, however big the answer.
        async with self.client.stream(
            "POST",
            url.copy_with(host=str(found[0])),
            content=delivery.body,
            headers=headers,
            extensions=extensions,
        ) as response:
            return Sent(delivery, response.status_code, None)


@contextlib.asynccontextmanager
async def sending(
    policy: Policy, clock: Clock, look_up: Resolve = resolve, verify: ssl.SSLContext | None = None
) -> AsyncIterator[Sender]:
    """A pass's sender; ``verify``: the CAs receivers' certificates are checked against
    (default: the system's)."""
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(rules.TIMEOUT_S),
        follow_redirects=False,
        trust_env=False,
        verify=verify if verify is not None else True,
    )
    async with client:
        yield Sender(client, policy, clock, look_up)
