"""Astraeus' tests. Their helpers (tests/support) are checked with pytest's assertion
messages, as a test module is: registered here, before any of them is imported."""

import pytest

pytest.register_assert_rewrite("tests.support")
