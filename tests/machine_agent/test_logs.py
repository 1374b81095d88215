"""Logs on the machine: tails, the failure snapshot, archives, and bounded follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import logs
from agent.logs import LogFollower, WorkerLog


def test_a_follower_reads_whole_lines_as_they_are_written(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    log.append(b"before\n")
    follower = LogFollower(log)  # from now on
    assert follower.read() == ("", 0)
    log.append(b"step 1\nstep")
    assert follower.read() == ("step 1\n", 0)
    log.append(b" 2\n")
    assert follower.read() == ("step 2\n", 0)
    log.append(b"no newline at the end")
    assert follower.rest() == "no newline at the end\n"


def test_a_follower_that_falls_behind_skips_ahead_and_counts_what_it_missed(
    tmp_path: Path,
) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    follower = LogFollower(log)
    line = b"x" * 99 + b"\n"  # 100 bytes
    total = (logs.FOLLOW_CHUNK_BYTES * 3) // 100
    log.append(line * total)
    text, missed = follower.read()
    assert len(text.encode()) <= logs.FOLLOW_CHUNK_BYTES
    assert missed + text.count("\n") == total
    assert missed > 0


def test_the_snapshot_is_the_last_50_lines_at_most_16_kib(tmp_path: Path) -> None:
    # seed L-47: the last 50 lines of output (at most 16 KiB)
    log = WorkerLog(tmp_path, "41")
    log.begin()
    log.append("".join(f"line {i}\n" for i in range(200)).encode())
    assert log.snapshot().splitlines() == [f"line {i}" for i in range(150, 200)]
    log.append(("y" * 1000 + "\n").encode() * 50)
    assert len(log.snapshot().encode()) <= 16 * 1024


def test_an_archived_log_keeps_the_last_1000_lines_until_a_new_process(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    log.append("".join(f"{i}\n" for i in range(1500)).encode())
    log.archive()
    text, archived = log.tail(10_000)
    assert archived and text.splitlines() == [str(i) for i in range(500, 1500)]
    log.begin()
    assert log.tail(10) == ("", False)


def test_each_line_can_be_shown_with_the_time_it_arrived(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    t = 1_790_000_000_000  # 2026-09-21T...
    log.append(b"first\nsecond\n", at_ms=t)
    log.append(b"third\n", at_ms=t + 1500)
    text, _ = log.tail(2, timestamps=True)
    assert text.splitlines() == [
        "2026-09-21T14:13:20.000Z second",
        "2026-09-21T14:13:21.500Z third",
    ]
    assert log.tail(2)[0] == "second\nthird\n"  # the text itself carries no times
    log.archive()
    text, archived = log.tail(10, timestamps=True)
    assert archived and text.splitlines()[0] == "2026-09-21T14:13:20.000Z first"


def test_a_tail_reads_from_the_end_and_a_cut_log_keeps_its_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "MAX_LOG_BYTES", 10_000)
    log = WorkerLog(tmp_path, "41")
    log.begin()
    for i in range(500):
        log.append(f"line {i:04d}\n".encode(), at_ms=1_790_000_000_000 + i * 1000)
    assert log.size() <= 10_000 + 10  # cut back to its last half when it grew past the cap
    text, _ = log.tail(3, timestamps=True)
    assert text.splitlines() == [
        "2026-09-21T14:21:37.000Z line 0497",
        "2026-09-21T14:21:38.000Z line 0498",
        "2026-09-21T14:21:39.000Z line 0499",
    ]
