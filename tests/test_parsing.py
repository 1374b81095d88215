"""Numbers in parameters (issue 18): read within bounds, never asked of `int` unbounded."""

from __future__ import annotations

import pytest

from backend.parsing import whole_number


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", 1),
        (" 42 ", 42),
        ("500", 500),
        (7, 7),
        ("0", None),
        ("501", None),
        ("-1", None),
        ("", None),
        ("1.5", None),
        ("1e3", None),
        ("\u00b2", None),  # isdigit() says yes; int() says no
        ("\u0661", None),  # an Arabic-Indic one: int() reads it, but no parameter is written so
        ("9" * 5000, None),  # int() refuses past 4 300 digits with a ValueError
        ("99999999999999999999999", None),
        (10**30, None),
    ],
)
def test_a_whole_number_within_bounds(raw: str | int, expected: int | None) -> None:
    assert whole_number(raw, 1, 500) == expected


def test_the_64_bit_bounds() -> None:
    top = 2**63 - 1
    assert whole_number(str(top), 1, top) == top
    assert whole_number(str(top + 1), 1, top) is None
    assert whole_number("-5", -10, 10) == -5
