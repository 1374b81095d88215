"""`astra astraeus` says one of a thing in the singular (issue 36: "1 workers")."""

from __future__ import annotations

from backend.cli.astra.main import missed_notice


def test_a_follower_told_of_missed_lines_counts_them_right() -> None:
    assert [missed_notice(n) for n in (1, 2, 1000)] == [
        "[… 1 line missed]",
        "[… 2 lines missed]",
        "[… 1000 lines missed]",
    ]
