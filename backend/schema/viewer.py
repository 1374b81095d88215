"""Who the caller is, as its token says."""

from __future__ import annotations

import strawberry

from backend.access.rules import Principal


@strawberry.type(description="The caller: a user acting in a workspace of an organisation.")
class Viewer:
    user: str
    organization: str
    workspace: str | None
    is_org_admin: bool

    @classmethod
    def from_principal(cls, principal: Principal) -> Viewer:
        return cls(
            user=principal.user_name,
            organization=principal.organization_name,
            workspace=principal.workspace_name,
            is_org_admin=principal.is_org_admin,
        )
