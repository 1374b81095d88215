"""How the agent reaches the server: TLS, or plaintext only where nothing crosses a network.

The machine token (and every secret value the server sends) travels on this channel. The agent
verifies the server with a CA file (``--ca-file``) or the system's CAs (``--tls``), and may
present a client certificate. Without TLS it connects only to a loopback address (`astraeus up`'s
local agent), unless ``--insecure`` says the network between them is trusted; the refusal comes
before any connection is opened, so the token is never sent.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc


class TransportRefused(Exception):
    """The agent's connection settings are unusable or unsafe: a sentence saying which and why."""


def resolves_to_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one. A name that does not resolve is
    not: it could resolve elsewhere by the time a connection is made."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = {str(info[4][0]).split("%")[0] for info in found}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def target_host(server: str) -> str | None:
    """The host of a gRPC target (``host:port``, ``[v6]:port``, ``dns:///host:port``); None for
    a Unix socket (``unix:…``), which never leaves the machine."""
    if server.startswith(("unix:", "unix-abstract:")):
        return None
    if "://" in server:
        server = server.split("://", 1)[1].rsplit("/", 1)[-1]
    elif server.startswith("dns:"):
        server = server[len("dns:") :]
    if server.startswith("["):
        return server[1:].split("]", 1)[0]
    if server.count(":") > 1:  # a bare IPv6 address with no port
        return server
    return server.rsplit(":", 1)[0] if ":" in server else server


def _read(path: Path, option: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TransportRefused(
            f"astraeus agent: {option} {path}: cannot be read ({error.strerror})"
        ) from None
    if b"-----BEGIN " not in data:
        raise TransportRefused(f"astraeus agent: {option} {path}: is not a PEM file")
    return data


@dataclass(frozen=True)
class Transport:
    """What the agent's options say about the channel to the server."""

    ca_file: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    # The name the server's certificate must carry when it differs from the host connected to
    # (an address, or a proxy's name inside a private network).
    server_name: str | None = None
    tls: bool = False  # TLS with the system's CAs when there is no CA file
    insecure: bool = False  # plaintext off loopback: the network is trusted

    @property
    def encrypted(self) -> bool:
        return bool(self.tls or self.ca_file or self.client_cert or self.client_key)

    def credentials(self, server: str) -> grpc.ChannelCredentials | None:
        """The channel's TLS credentials, the files read now; None for plaintext, which is
        refused (TransportRefused) to an address that is not loopback unless ``insecure``."""
        if self.insecure and self.encrypted:
            raise TransportRefused(
                "astraeus agent: --insecure (ASTRAEUS_AGENT_INSECURE) asks for plaintext, and "
                "--tls, --ca-file or --client-cert for TLS: give one or the other"
            )
        if not self.encrypted:
            self.check_plaintext(server)
            return None
        if (self.client_cert is None) != (self.client_key is None):
            raise TransportRefused(
                "astraeus agent: --client-cert and --client-key (ASTRAEUS_AGENT_CLIENT_CERT, "
                "ASTRAEUS_AGENT_CLIENT_KEY) go together: give both or neither"
            )
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "--ca-file") if self.ca_file else None,
            private_key=_read(self.client_key, "--client-key") if self.client_key else None,
            certificate_chain=_read(self.client_cert, "--client-cert")
            if self.client_cert
            else None,
        )

    def check_plaintext(self, server: str) -> None:
        """Refuse plaintext to ``server`` unless it is on this machine or ``insecure`` says so."""
        host = target_host(server)
        if self.insecure or host is None or resolves_to_loopback(host):
            return
        raise TransportRefused(
            f"astraeus agent: refusing to connect to {server} in plaintext: it is not a loopback "
            "address, and the machine token would cross the network in clear. Give the server's "
            "CA with --ca-file (ASTRAEUS_AGENT_CA_FILE) or --tls to trust the system's CAs; "
            "--insecure (ASTRAEUS_AGENT_INSECURE=true) allows plaintext on a network you trust."
        )

    def channel(self, server: str) -> grpc.aio.Channel:
        """A channel to ``server``, checked again as it opens: nothing is sent in plaintext off
        loopback, whatever built this agent's settings."""
        credentials = self.credentials(server)
        if credentials is None:
            return grpc.aio.insecure_channel(server)
        options = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return grpc.aio.secure_channel(server, credentials, options=options)
