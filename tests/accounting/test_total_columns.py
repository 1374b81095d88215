"""The running totals' columns (models/goodput.py, written out there) are the goodput
categories of accounting.rules, in their order: a report reads them by position."""

from backend.accounting.rules import CATEGORIES
from backend.models.goodput import CATEGORY_VALUES, TOTAL_COLUMNS


def test_the_columns_follow_the_categories() -> None:  # seed G-18
    assert tuple(c.value for c in CATEGORIES) == CATEGORY_VALUES
    assert TOTAL_COLUMNS[: len(CATEGORIES)] == tuple(f"{c.value}_held" for c in CATEGORIES)
    assert TOTAL_COLUMNS[len(CATEGORIES) :] == tuple(f"{c.value}_not_held" for c in CATEGORIES)
