"""Fixtures of the machine agent's live tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A real server and the agents a test starts on it (tests/e2e/test_agent_process.py)."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
