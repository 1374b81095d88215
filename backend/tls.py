"""TLS for the server's two listeners: the HTTP API (uvicorn) and the agents' gRPC endpoint.

Both serve the certificate and key of ``ASTRAEUS_TLS_CERT`` / ``ASTRAEUS_TLS_KEY``; with
``ASTRAEUS_AGENT_CLIENT_CA`` the agents' endpoint also requires a client certificate signed by
that CA. Without a certificate the server listens in plaintext, which it does only on a loopback
host unless ``ASTRAEUS_ALLOW_PLAINTEXT`` says a proxy in front terminates TLS (as
docker-compose.yml's nginx does): tokens, secret values and logs never cross a network in clear.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agent.transport import resolves_to_loopback
from backend.config import Settings
from backend.errors import AstraeusError


def _refused(message: str) -> AstraeusError:
    return AstraeusError(code="settings", message=message)


def _read(path: Path, setting: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise _refused(f"ASTRAEUS_{setting}: {path} cannot be read ({error.strerror})") from None
    if b"-----BEGIN " not in data:
        raise _refused(f"ASTRAEUS_{setting}: {path} is not a PEM file")
    return data


@dataclass(frozen=True)
class ServerTls:
    """The certificate the server listens with, checked and read when it starts."""

    cert: Path
    key: Path
    cert_pem: bytes
    key_pem: bytes
    agent_client_ca: bytes | None

    def uvicorn_options(self) -> dict[str, Any]:
        return {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.agent_client_ca,
            require_client_auth=self.agent_client_ca is not None,
        )


def server_tls(settings: Settings) -> ServerTls | None:
    """The server's TLS from its settings; None to listen in plaintext, which is refused (an
    error naming the settings) on a host that is not loopback unless allowed."""
    if settings.tls_cert is None and settings.tls_key is None:
        if settings.agent_client_ca is not None:
            raise _refused(
                "ASTRAEUS_AGENT_CLIENT_CA needs TLS: set ASTRAEUS_TLS_CERT and ASTRAEUS_TLS_KEY"
            )
        if not settings.allow_plaintext and not resolves_to_loopback(settings.host):
            raise _refused(
                f"ASTRAEUS_HOST is {settings.host!r}, not a loopback address, and the server "
                "has no certificate: set ASTRAEUS_TLS_CERT and ASTRAEUS_TLS_KEY, or "
                "ASTRAEUS_ALLOW_PLAINTEXT=true where a proxy in front of it terminates TLS"
            )
        return None
    if settings.tls_cert is None or settings.tls_key is None:
        missing = "ASTRAEUS_TLS_CERT" if settings.tls_cert is None else "ASTRAEUS_TLS_KEY"
        raise _refused(f"ASTRAEUS_TLS_CERT and ASTRAEUS_TLS_KEY go together: {missing} is unset")
    tls = ServerTls(
        cert=settings.tls_cert,
        key=settings.tls_key,
        cert_pem=_read(settings.tls_cert, "TLS_CERT"),
        key_pem=_read(settings.tls_key, "TLS_KEY"),
        agent_client_ca=(
            _read(settings.agent_client_ca, "AGENT_CLIENT_CA") if settings.agent_client_ca else None
        ),
    )
    _check_pair(tls)
    if settings.agent_client_ca is not None:
        try:
            ssl.create_default_context(cafile=str(settings.agent_client_ca))
        except ssl.SSLError:
            raise _refused(
                f"ASTRAEUS_AGENT_CLIENT_CA: {settings.agent_client_ca} holds no CA certificate"
            ) from None
    return tls


def _check_pair(tls: ServerTls) -> None:
    """The key is the certificate's (a mismatch would otherwise surface as every handshake
    failing, with no word on why)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # no password: an encrypted key is refused here, never prompted for on a terminal
        context.load_cert_chain(str(tls.cert), str(tls.key), password=lambda: b"")
    except ssl.SSLError as error:
        raise _refused(
            f"ASTRAEUS_TLS_KEY: {tls.key} is not the key of ASTRAEUS_TLS_CERT {tls.cert} "
            f"({error.reason or error})"
        ) from None
