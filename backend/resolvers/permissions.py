"""Permission classes. Every mutation carries one; a test fails on any that does not."""

from __future__ import annotations

from typing import Any

from strawberry.permission import BasePermission

from backend.errors import DatabaseUnavailable
from backend.request.context import Info


class IsAuthenticated(BasePermission):
    """The caller sent a valid API token."""

    message = "A valid API token is required: send 'Authorization: Bearer <token>'."
    error_extensions = {"code": "UNAUTHENTICATED"}

    def has_permission(self, source: Any, info: Info, **kwargs: Any) -> bool:
        if info.context.database_away:
            raise DatabaseUnavailable()  # not the token's fault: the caller may try again
        return info.context.principal is not None
