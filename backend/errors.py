"""Errors a user can cause and can fix: each has a stable code, a sentence, and the fields at fault.

Anything else is a bug and is masked at the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FieldError:
    """One bad value: the field's path (``mounts[0].path``) and why it is refused."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass
class AstraeusError(Exception):
    code: str
    message: str
    status: int = 400
    fields: list[FieldError] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def extensions(self) -> dict[str, str]:
        """What GraphQL says beside the message (graphql-core reads it off the error)."""
        return {"code": self.code}


class NotFound(AstraeusError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(code=code, message=message, status=404)


class Conflict(AstraeusError):
    def __init__(self, code: str, message: str, fields: list[FieldError] | None = None) -> None:
        super().__init__(code=code, message=message, status=409, fields=fields or [])


class InvalidInput(AstraeusError):
    def __init__(self, code: str, fields: list[FieldError]) -> None:
        summary = "; ".join(str(f) for f in fields)
        super().__init__(code=code, message=summary, status=400, fields=fields)


class Unauthenticated(AstraeusError):
    def __init__(self, message: str) -> None:
        super().__init__(code="UNAUTHENTICATED", message=message, status=401)


class Forbidden(AstraeusError):
    def __init__(self, message: str) -> None:
        super().__init__(code="FORBIDDEN", message=message, status=403)


class DatabaseUnavailable(AstraeusError):
    """The database does not answer (restarting, unreachable): the request can be tried again."""

    def __init__(self) -> None:
        super().__init__(
            code="DATABASE_UNAVAILABLE",
            message="Astraeus cannot reach its database just now; try again in a moment.",
            status=503,
        )


class ConflictRetry(AstraeusError):
    """The request's work lost to other requests changing the same things at once (a
    deadlock, a serialisation failure) and kept losing when tried again: nothing was changed,
    and the same request sent again is expected to succeed."""

    def __init__(self) -> None:
        super().__init__(
            code="CONFLICT_RETRY",
            message=(
                "Other requests changed the same things at once and this one gave way; "
                "nothing was changed: send it again."
            ),
            status=409,
        )
