"""Types shared by every domain's schema: expected errors are part of the schema."""

from __future__ import annotations

from typing import NewType

import strawberry

from backend.errors import AstraeusError

# A whole number past GraphQL's 32-bit Int: Slurm's priorities reach 4294967295 (issue 38).
# The schema maps it to its scalar (schema.py: StrawberryConfig.scalar_map).
BigInt = NewType("BigInt", int)
BIG_INT = strawberry.scalar(
    name="BigInt",
    description="A whole number past GraphQL's 32-bit Int (exact to 2^53, as JSON numbers "
    "are): Slurm's priorities reach 4294967295.",
    serialize=int,
    parse_value=int,
)


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
