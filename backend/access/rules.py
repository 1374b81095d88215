"""Pure access rules: what a principal may see. No database, no clock."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

TOKEN_PREFIX = "astx_"


def hash_token(secret: str) -> str:
    """Tokens are long random strings, so one SHA-256 is enough to store them safely."""
    return hashlib.sha256(secret.encode()).hexdigest()


def looks_like_token(secret: str) -> bool:
    return secret.startswith(TOKEN_PREFIX) and 20 <= len(secret) <= 128


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


@dataclass(frozen=True)
class AgentPrincipal:
    """A machine's agent, as its token says: it may join one cluster of one organisation."""

    token_id: int
    organization_id: int
    cluster_id: int
