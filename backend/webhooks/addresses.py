"""Where a webhook may be sent, pure: which addresses are inside (loopback, link-local,
private, shared, unspecified, multicast, the server's own) and so refused, however they are
written, unless an admin's allow-list names them.

A host is read as the resolver would read it: ``0x7f000001``, ``2130706433``, ``127.1`` and
``0177.0.0.1`` are all 127.0.0.1 to ``getaddrinfo`` (inet_aton's forms), and an IPv6 address
may carry an IPv4 one (``::ffff:127.0.0.1``, ``::127.0.0.1``, 6to4, NAT64)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from backend.config import IPNetwork

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# What a user is told, whatever the reason: nothing about what is (or is not) there.
REFUSED = "refused: private address"

# Names that are the machine itself wherever they are resolved (RFC 6761).
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT


@dataclass(frozen=True)
class Policy:
    """The admin's allow-list, and where the server itself listens: its ports (on loopback or
    its own addresses) are never a webhook's destination, allowed or not."""

    allow: tuple[IPNetwork, ...] = ()
    own_addresses: frozenset[IPAddress] = field(default_factory=frozenset)
    own_ports: frozenset[int] = field(default_factory=frozenset)


def literal(host: str) -> IPAddress | None:
    """The address a host names by itself (no resolver asked), in any form the resolver
    takes: an IPv6 address (brackets already stripped) or inet_aton's IPv4 forms."""
    text = host.strip().rstrip(".").lower()
    if not text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    return _inet_aton(text)


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """``a``, ``a.b``, ``a.b.c`` or ``a.b.c.d``, each part decimal, octal (0…) or hex (0x…),
    the last part filling the bytes left: what glibc's inet_aton reads."""
    parts = text.split(".")
    if len(parts) > 4:
        return None
    numbers = []
    for part in parts:
        number = _number(part)
        if number is None:
            return None
        numbers.append(number)
    *leading, last = numbers
    if any(n > 0xFF for n in leading) or last >= 256 ** (4 - len(leading)):
        return None
    value = 0
    for n in leading:
        value = value << 8 | n
    value = value << 8 * (4 - len(leading)) | last
    return ipaddress.IPv4Address(value)


def _number(part: str) -> int | None:
    if _HEX.fullmatch(part):
        return int(part[2:], 16)
    if _OCTAL.fullmatch(part):
        return int(part, 8)
    if _DECIMAL.fullmatch(part):
        return int(part, 10)
    return None


_HEX = re.compile(r"0[xX][0-9a-fA-F]+")
_OCTAL = re.compile(r"0[0-7]*")
_DECIMAL = re.compile(r"[1-9][0-9]*")


def is_local_name(host: str) -> bool:
    text = host.strip().rstrip(".").lower()
    return text in _LOCAL_NAMES or text.endswith(".localhost")


def refused(address: IPAddress, port: int, policy: Policy) -> bool:
    """Whether a connection to ``address:port`` would reach inside."""
    inner = _embedded_ipv4(address) or address
    if port in policy.own_ports and (
        inner.is_loopback or inner.is_unspecified or inner in policy.own_addresses
    ):
        return True  # the server itself: never, allow-list or not
    if any(inner in network for network in policy.allow if network.version == inner.version):
        return False
    if inner in policy.own_addresses:
        return True
    return _inside(inner)


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries: mapped (::ffff:a.b.c.d), compatible
    (::a.b.c.d), 6to4 (2002:…) or NAT64 (64:ff9b::a.b.c.d)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    packed = int(address)
    if address in _NAT64 or (packed >> 32 == 0 and packed > 1):
        return ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    return None


def _inside(address: IPAddress) -> bool:
    if (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_unspecified
        or address.is_multicast
        or address.is_reserved
        or not address.is_global
    ):
        return True
    if isinstance(address, ipaddress.IPv4Address):
        return address in _SHARED
    return address.is_site_local


def obviously_inside(host: str, port: int, policy: Policy) -> bool:
    """Refused when the webhook is created: a literal address inside, or a name that is the
    machine itself. (Names are resolved, and checked again, at each delivery.)"""
    address = ipaddress.IPv4Address("127.0.0.1") if is_local_name(host) else literal(host)
    return address is not None and refused(address, port, policy)
