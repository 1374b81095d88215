"""Which addresses are inside, pure: however they are written, wherever they are carried."""

from __future__ import annotations

from ipaddress import IPv4Address, ip_address

import pytest

from backend.config import parse_networks
from backend.webhooks import addresses
from backend.webhooks.addresses import Policy


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F000001", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("169.254.43518", "169.254.169.254"),
        ("10.0.0.1.", "10.0.0.1"),
        ("::1", "::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("0", "0.0.0.0"),
    ],
)
def test_literal_forms_the_resolver_reads(host: str, address: str) -> None:
    assert addresses.literal(host) == ip_address(address)


@pytest.mark.parametrize(
    "host", ["hooks.example.com", "127.0.0.1.example", "256.1.1.1", "1.2.3.4.5", "0x", "", "08"]
)
def test_names_are_no_literal(host: str) -> None:
    assert addresses.literal(host) is None


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.255.255.254",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "100.127.255.255",
        "0.0.0.0",
        "224.0.0.251",
        "239.255.255.250",
        "255.255.255.255",
        "240.0.0.1",
        "::",
        "::1",
        "fe80::1",
        "fc00::1",
        "fd12:3456::1",
        "fec0::1",
        "ff02::1",
        "::ffff:10.0.0.1",  # IPv4-mapped
        "::ffff:169.254.169.254",
        "::10.0.0.1",  # IPv4-compatible
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    ],
)
def test_addresses_inside_are_refused(address: str) -> None:
    assert addresses.refused(ip_address(address), 80, Policy())


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1"]
)
def test_public_addresses_are_not(address: str) -> None:
    assert not addresses.refused(ip_address(address), 443, Policy())


def test_the_allow_list_and_the_servers_own_addresses() -> None:
    own = frozenset({ip_address("203.0.113.9"), ip_address("93.184.215.14")})
    policy = Policy(
        allow=parse_networks("10.20.0.0/16, 127.0.0.1, fd00::/8"),
        own_addresses=own,
        own_ports=frozenset({8080, 8081}),
    )
    assert not addresses.refused(ip_address("10.20.9.9"), 80, policy)
    assert not addresses.refused(ip_address("::ffff:10.20.9.9"), 80, policy)
    assert not addresses.refused(ip_address("fd00::5"), 80, policy)
    assert not addresses.refused(ip_address("127.0.0.1"), 9000, policy)
    assert addresses.refused(ip_address("10.21.0.1"), 80, policy)
    assert addresses.refused(ip_address("127.0.0.2"), 9000, policy)
    # the server itself: on its own ports never, on its own addresses not unless allowed
    assert addresses.refused(ip_address("127.0.0.1"), 8080, policy)
    assert addresses.refused(ip_address("127.0.0.1"), 8081, policy)
    assert addresses.refused(ip_address("93.184.215.14"), 443, policy)
    assert not addresses.refused(ip_address("8.8.8.8"), 8080, policy)


def test_allow_lists_are_read_strictly() -> None:
    assert parse_networks("") == ()
    assert parse_networks(" 10.0.0.0/8 ,127.0.0.1;::1 ") == (
        *parse_networks("10.0.0.0/8"),
        *parse_networks("127.0.0.1/32"),
        *parse_networks("::1/128"),
    )
    for bad in ("10.1.2.3/8", "10.0.0.0/33", "intranet", "10.0.0.0/8,x"):
        with pytest.raises(ValueError, match=r"is not a network such as 10\.0\.0\.0/8"):
            parse_networks(bad)


def test_local_names_are_the_machine_itself() -> None:
    for host in ("localhost", "LOCALHOST.", "api.localhost", "localhost.localdomain"):
        assert addresses.is_local_name(host)
        assert addresses.obviously_inside(host, 80, Policy())
    assert not addresses.is_local_name("localhost.example.com")
    assert not addresses.obviously_inside("hooks.example.com", 80, Policy())
    assert addresses.literal("localhost") is None
    assert IPv4Address("127.0.0.1") in parse_networks("127.0.0.0/8")[0]
