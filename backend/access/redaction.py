"""Tokens never reach a log: the server's access log writes each request's path with its query,
and a token sent there (refused: tokens go in the Authorization header) would be kept in it."""

from __future__ import annotations

import logging
import re

from backend.access.rules import TOKEN_PREFIX

# An Astraeus token wherever it appears, and the value of a query parameter that names a
# credential, whatever it holds.
_TOKEN = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_\-%]+")
_CREDENTIAL_PARAMETER = re.compile(
    r"(?i)([?&;](?:token|access_token|api_key|apikey|auth|authorization|key|password|secret)=)"
    r"[^&;#\s\"]*"
)
REDACTED = "[redacted]"
# uvicorn's loggers: requests (access) and WebSocket handshakes, errors (error).
LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    return _TOKEN.sub(TOKEN_PREFIX + REDACTED, _CREDENTIAL_PARAMETER.sub(r"\1" + REDACTED, text))


class TokenRedaction(logging.Filter):
    """Rewrites a record's message and string arguments without the tokens they hold."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {
                k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()
            }
        return True


def install() -> None:
    """On uvicorn's loggers (after uvicorn has configured logging)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, TokenRedaction) for f in logger.filters):
            logger.addFilter(TokenRedaction())
