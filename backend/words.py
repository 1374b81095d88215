"""Words every sentence shares: a count with its noun, one or many (issue 36: "1 of 1 workers
running", "room for 0 of 1 workers")."""

from __future__ import annotations


def counted(n: int, one: str, many: str | None = None) -> str:
    """``1 worker``, ``2 workers``, ``0 workers``; ``many`` where adding an s is wrong."""
    return f"{n} {one if n == 1 else many or one + 's'}"
