"""The one way a mutation changes the database: a unit of work, its payload on success, its
refusal as the schema's errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from backend.errors import AstraeusError
from backend.request.context import Info
from backend.schema.common import UserError

T = TypeVar("T")
P = TypeVar("P")


async def mutate(
    info: Info,
    work: Callable[[AsyncSession], Awaitable[T]],
    done: Callable[[T], P],
    refused: Callable[[list[UserError]], P],
) -> P:
    """``work`` in a transaction of its own, tried again whole if it lost to another
    transaction (issue 19); ``done`` makes the payload of what it returned, ``refused`` the
    payload of an expected error (an unexpected one goes on up, masked)."""
    try:
        found = await info.context.db.unit(work)
    except AstraeusError as error:
        return refused(UserError.from_error(error))
    return done(found)
