"""Logs on the machine: tails, the failure snapshot, archives, and bounded follows."""

from __future__ import annotations

from pathlib import Path

from agent import logs
from agent.logs import LogFollower, WorkerLog


def test_a_follower_reads_whole_lines_as_they_are_written(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "w-0")
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
    log = WorkerLog(tmp_path, "w-0")
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
    log = WorkerLog(tmp_path, "w-0")
    log.begin()
    log.append("".join(f"line {i}\n" for i in range(200)).encode())
    assert log.snapshot().splitlines() == [f"line {i}" for i in range(150, 200)]
    log.append(("y" * 1000 + "\n").encode() * 50)
    assert len(log.snapshot().encode()) <= 16 * 1024


def test_an_archived_log_keeps_the_last_1000_lines_until_a_new_process(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "w-0")
    log.begin()
    log.append("".join(f"{i}\n" for i in range(1500)).encode())
    log.archive()
    text, archived = log.tail(10_000)
    assert archived and text.splitlines() == [str(i) for i in range(500, 1500)]
    log.begin()
    assert log.tail(10) == ("", False)
