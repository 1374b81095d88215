"""Subscriptions last only as long as their token: each stream ends with the reason once its
token is revoked or expires (backend/access/watch.py looks every few seconds)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

from backend.access.watch import watch_of
from backend.errors import Unauthenticated
from backend.request.context import Info

T = TypeVar("T")


async def while_token_holds(info: Info, source: AsyncGenerator[T, None]) -> AsyncIterator[T]:
    """What ``source`` yields, until its token is refused: then an error saying why."""
    principal = info.context.require_principal()
    watch = watch_of(info.context.db, info.context.clock)
    async with watch.watching(principal.token_id) as stream:
        refused = asyncio.ensure_future(stream.refused.wait())
        item: asyncio.Future[T] | None = None
        try:
            while True:
                item = asyncio.ensure_future(anext(source))
                await asyncio.wait({item, refused}, return_when=asyncio.FIRST_COMPLETED)
                if stream.refused.is_set():
                    raise Unauthenticated(stream.reason)
                try:
                    value = item.result()
                except StopAsyncIteration:
                    return
                item = None
                yield value
        finally:
            refused.cancel()
            if item is not None and not item.done():
                item.cancel()
                with contextlib.suppress(BaseException):
                    await item
            await source.aclose()
