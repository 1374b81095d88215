"""Logs on the machine: tails, the failure snapshot, archives, and bounded follows."""

from __future__ import annotations

import multiprocessing
import time
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


def test_a_follow_goes_on_from_where_its_tail_ended_losing_and_repeating_nothing(
    tmp_path: Path,
) -> None:
    # a line written between the tail and the follower's start was lost (test_routing, CI)
    log = WorkerLog(tmp_path, "41")
    log.begin()
    log.append(b"line 0\nline 1\nline")
    text, archived, offset = log.tail_to_follow(1000)
    assert (text, archived) == ("line 0\nline 1\n", False)  # the half-written line waits
    log.append(b" 2\nline 3\n")  # written before the follower starts
    follower = LogFollower(log, offset)
    assert follower.read() == ("line 2\nline 3\n", 0)
    log.append(b"line 4\n")
    assert follower.read() == ("line 4\n", 0)
    assert log.tail_to_follow(2)[0] == "line 3\nline 4\n"
    assert WorkerLog(tmp_path, "none").tail_to_follow(10) == ("", False, 0)


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
    # seed L-21: the failure snapshot's last 50 lines of output (at most 16 KiB)
    log = WorkerLog(tmp_path, "41")
    log.begin()
    log.append("".join(f"line {i}\n" for i in range(200)).encode())
    assert log.snapshot().splitlines() == [f"line {i}" for i in range(150, 200)]
    log.append(("y" * 1000 + "\n").encode() * 50)
    assert len(log.snapshot().encode()) <= 16 * 1024


def test_an_archived_log_keeps_the_last_1000_lines_until_a_new_process(tmp_path: Path) -> None:
    # seed L-19: the last 1 000 lines kept once the process is gone, served as archived
    # seed L-20: a new process for the same worker replaces them (live: test_on_the_machine)
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


# --- bounds (issue 18): one workload's log never stalls the machine ------------------------

MIB = 2**20


def test_a_long_line_is_cut_at_64_kib_with_a_marker_across_writes(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    log.append(b"short\n")
    for _ in range(40):  # one line of 2.5 MiB in 64 KiB writes, as the shim reads a pipe
        log.append(b"x" * 65536)
    log.append(b"x" * 100 + b"\nafter\n")
    text, _ = log.tail(10)
    lines = text.splitlines()
    assert lines[0] == "short"
    assert lines[1] == "x" * logs.LINE_BYTES + logs.LINE_CUT.decode()
    assert lines[2:] == ["after"]
    assert log.size() == 6 + logs.LINE_BYTES + len(logs.LINE_CUT) + 1 + 6


def test_a_new_writer_carries_on_the_line_the_last_one_left(tmp_path: Path) -> None:
    # The shim is a process of its own; a second WorkerLog reads the unfinished line's length.
    first = WorkerLog(tmp_path, "41")
    first.begin()
    first.append(b"done\n" + b"a" * 60_000)
    WorkerLog(tmp_path, "41").append(b"b" * 10_000)
    WorkerLog(tmp_path, "41").append(b"c" * 10 + b"\nnext\n")
    lines = first.tail(10)[0].splitlines()
    assert lines == [
        "done",
        "a" * 60_000 + "b" * (logs.LINE_BYTES - 60_000) + logs.LINE_CUT.decode(),
        "next",
    ]


def test_a_cut_keeps_utf8_characters_whole(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    log.append(b"a" + "€".encode() * 30_000 + b"\n")
    line = log.tail(1)[0].rstrip("\n")
    assert "\ufffd" not in line
    assert line == "a" + "€" * ((logs.LINE_BYTES - 1) // 3) + logs.LINE_CUT.decode()


def test_a_62_mib_one_line_log_is_kept_to_64_kib_and_tailed_at_once(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    chunk = b"z" * 65536
    began = time.monotonic()
    for _ in range(62 * 16):
        log.append(chunk)
    written = time.monotonic() - began
    assert log.size() == logs.LINE_BYTES + len(logs.LINE_CUT)
    began = time.monotonic()
    for _ in range(4):
        text, _ = log.tail(1000, timestamps=True)
    assert time.monotonic() - began < 0.5
    assert text.endswith(logs.LINE_CUT.decode())
    assert len(text) < logs.LINE_BYTES + 100
    assert written < 5.0  # a write is linear in its size: dropping costs next to nothing
    assert len(logs._times(log.current).read_bytes()) <= 62 * 16 * logs.TIME.size


def test_a_tail_of_a_62_mib_line_left_by_an_older_agent_reads_1_mib_from_its_end(
    tmp_path: Path,
) -> None:
    # A log written before lines were cut (or by anything else): one line, no newline.
    log = WorkerLog(tmp_path, "41")
    log.begin()
    with log.current.open("wb") as f:
        for _ in range(62):
            f.write(b"q" * MIB)
    began = time.monotonic()
    for _ in range(4):
        assert log.tail(1000) == ("", False)  # part of a line, never shown as a whole one
    assert time.monotonic() - began < 0.5
    with log.current.open("ab") as f:
        f.write(b"\nlast words\n")
    assert log.tail(1000) == ("last words\n", False)
    assert len(log.snapshot()) == len("last words\n")


def test_a_tail_reads_at_most_1_mib_of_many_cut_lines(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    for i in range(40):
        log.append(f"{i:02d}".encode() + b"w" * 70_000 + b"\n")
    text, _ = log.tail(10_000)
    data = text.encode()
    assert len(data) <= logs.TAIL_BYTES
    line = logs.LINE_BYTES + len(logs.LINE_CUT) + 1
    assert len(text.splitlines()) == logs.TAIL_BYTES // line
    assert text.splitlines()[-1].startswith("39")


def test_an_archive_is_bounded_in_bytes_and_says_what_it_left_out(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    t = 1_790_000_000_000
    for i in range(50):  # 50 lines of 64 KiB: 3.2 MiB, past the archive's 1 MiB
        log.append(f"{i:02d}".encode() + b"v" * 70_000 + b"\n", at_ms=t + i * 1000)
    log.archive()
    text, archived = log.tail(10_000, timestamps=True)
    assert archived
    lines = text.splitlines()
    kept = logs.ARCHIVED_BYTES // (logs.LINE_BYTES + len(logs.LINE_CUT) + 1)
    left_out = (50 - kept) * (logs.LINE_BYTES + len(logs.LINE_CUT) + 1)
    first = logs._rfc3339(t + (50 - kept) * 1000)  # the marker shows the first kept write's
    assert lines[0] == (
        f"{first} [earlier output not kept: "
        f"{left_out / MIB:.1f} MiB (an archived log keeps its last 1 MiB)]"
    )
    assert len(lines) == kept + 1
    assert lines[1].startswith(f"{first} {50 - kept:02d}vvv")
    assert lines[-1].split(" ", 1)[1].startswith("49vvv")
    assert log.archived.stat().st_size <= logs.ARCHIVED_BYTES + 200


def test_a_log_cut_back_keeps_its_last_half_from_a_line_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "MAX_LOG_BYTES", 3 * MIB)
    log = WorkerLog(tmp_path, "41")
    log.begin()
    for i in range(400):
        log.append(f"{i:04d} ".encode() + b"u" * 9_994 + b"\n")
    assert log.size() <= 3 * MIB
    lines = log.tail(10_000)[0].splitlines()
    assert all(len(line) == 9_999 for line in lines)
    assert lines[-1].startswith("0399 ")


def test_a_follower_brings_a_long_line_cut_with_its_marker(tmp_path: Path) -> None:
    log = WorkerLog(tmp_path, "41")
    log.begin()
    follower = LogFollower(log)
    for _ in range(62):  # 62 MiB, one line, no newline yet
        log.append(b"f" * MIB)
    assert follower.read() == ("", 0)  # no whole line yet: nothing, and nothing held
    log.append(b"f\nnext\n")
    cut = "f" * logs.LINE_BYTES + logs.LINE_CUT.decode()
    assert follower.read() == (f"{cut}\nnext\n", 0)
    log.append(b"last, without its newline")
    assert follower.rest() == "last, without its newline\n"


def _write_numbered(root: Path, count: int) -> None:
    log = WorkerLog(root, "w")
    for i in range(1, count + 1):
        log.append(b"line\n", at_ms=i)  # write i, dated i


def test_a_reader_that_sees_a_write_finds_its_time(tmp_path: Path) -> None:
    """The sampler reads a log's size, then its last write's time, while the shim writes in
    another process: a write's time is recorded before its text, so a size that shows a write
    never comes with an older time (the CI found a Slurm job's last line dated when the agent
    next looked, 1.8 s after it was written: its text was seen before its time record)."""
    log = WorkerLog(tmp_path, "w")
    log.begin()
    writer = multiprocessing.get_context("spawn").Process(
        target=_write_numbered, args=(tmp_path, 3000)
    )
    writer.start()
    looks = 0
    try:
        while writer.is_alive() or looks == 0:
            size = log.size()
            written = log.last_written_ms()
            if size:
                assert written is not None and written >= size // len(b"line\n"), (size, written)
            looks += 1
    finally:
        writer.join(30)
    assert log.size() == 3000 * len(b"line\n") and log.last_written_ms() == 3000
