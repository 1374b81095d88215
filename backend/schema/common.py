"""Types shared by every domain's schema: expected errors are part of the schema."""

from __future__ import annotations

import strawberry

from backend.errors import AstraeusError


@strawberry.type(description="Why a mutation was refused: a stable code, the field, the reason.")
class UserError:
    code: str
    field: str | None
    message: str

    @classmethod
    def from_error(cls, error: AstraeusError) -> list[UserError]:
        if error.fields:
            return [cls(code=error.code, field=f.field, message=f.reason) for f in error.fields]
        return [cls(code=error.code, field=None, message=error.message)]
