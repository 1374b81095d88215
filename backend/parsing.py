"""Numbers in parameters, read within bounds before Python is asked to convert them."""

from __future__ import annotations

# Python refuses to read an int of over 4 300 digits (a ValueError, a 500 where it was not
# expected), and `str.isdigit` accepts '²', which `int` does not: only ASCII digits, at most 19.
_MAX_DIGITS = 19

# The biggest id a row may have (BIGINT, and SQLite's INTEGER): a bigger one names nothing.
BIGGEST_ID = 2**63 - 1


def whole_number(raw: str | int, low: int, high: int) -> int | None:
    """``raw`` as a whole number from ``low`` to ``high``, else None (the caller names the
    parameter and its bounds)."""
    if isinstance(raw, int):
        return raw if low <= raw <= high else None
    text = raw.strip()
    digits = text.removeprefix("-")
    if not digits or len(digits) > _MAX_DIGITS or not (digits.isascii() and digits.isdigit()):
        return None
    number = int(text)
    return number if low <= number <= high else None
