"""Subscriptions read in the test's process, through the schema, and left as the server leaves
them when its client goes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any


async def leave(results: AsyncGenerator[Any, None]) -> None:
    """Stop reading ``results`` as strawberry does when a subscriber goes: the read of the next
    result is cancelled where it waits, which ends every generator under it, each running its
    own cleanup (the events bell's listener, the token watch). ``aclose()`` alone ends only the
    outermost generator, strawberry's: the resolver's own was left to the garbage collector,
    and its events bell's read, cancelled with the test's event loop, kept its connection from
    the pool (SQLAlchemy's "non-checked-in connection" warning, reported against whichever test
    ran next in the lane)."""
    while True:
        reading = asyncio.ensure_future(anext(results))
        await asyncio.sleep(0)  # to where it waits for the next result
        if not reading.done():
            reading.cancel()
        try:
            await reading
        except (asyncio.CancelledError, StopAsyncIteration):
            break
        # a result was ready already: read on to where it waits
    with contextlib.suppress(RuntimeError):  # (closed already)
        await results.aclose()
