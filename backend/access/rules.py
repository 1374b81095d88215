"""Pure access rules: what a principal may see. No database, no clock."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from backend.parsing import BIGGEST_ID, whole_number

TOKEN_PREFIX = "astx_"


def hash_token(secret: str) -> str:
    """Tokens are long random strings, so one SHA-256 is enough to store them safely."""
    return hashlib.sha256(secret.encode()).hexdigest()


def looks_like_token(secret: str) -> bool:
    return secret.startswith(TOKEN_PREFIX) and 20 <= len(secret) <= 128


REVOKED = "The API token is unknown or revoked."
EXPIRED = "The API token has expired."


def token_refusal(
    revoked_at: datetime | None, expires_at: datetime | None, now: datetime
) -> str | None:
    """Why a known token is refused at ``now``, or None while it is good."""
    if revoked_at is not None:
        return REVOKED
    if expires_at is not None and expires_at <= now:
        return EXPIRED
    return None


def token_reference(reference: str) -> tuple[int | None, str | None]:
    """``astraeus token revoke 12`` names a token by its id, ``… astx_Ab3dE`` by its first
    characters: (id, None) or (None, prefix)."""
    text = reference.strip()
    token_id = whole_number(text, 1, BIGGEST_ID) if text.isascii() and text.isdigit() else None
    if token_id is not None:
        return token_id, None
    return None, text  # digits past any id are a prefix no token has


@dataclass(frozen=True)
class Principal:
    """A caller, as its token says: a user acting in one workspace, maybe an organisation admin."""

    token_id: int
    user_id: int | None
    user_name: str
    organization_id: int
    organization_name: str
    workspace_id: int | None
    workspace_name: str | None
    is_org_admin: bool

    def can_see_workspace(self, workspace_id: int, organization_id: int) -> bool:
        if organization_id != self.organization_id:
            return False
        return self.is_org_admin or workspace_id == self.workspace_id

    def can_see_organization(self, organization_id: int) -> bool:
        return self.is_org_admin and organization_id == self.organization_id


def bearer_secret(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (HTTP, WebSocket or gRPC
    metadata); None without one."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None
