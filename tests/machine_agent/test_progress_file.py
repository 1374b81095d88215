"""The progress file as workloads write it (issue 20): overwritten or appended to, a bare step or
the SDK's JSON line, read from its end; a line still being written waits for the next look."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.executor import ProcessWorker
from agent.logs import WorkerLog
from agent.metrics import (
    PROGRESS_TAIL_BYTES,
    ProgressRead,
    ProgressReport,
    Sampler,
    parse_progress,
    read_progress,
    read_progress_file,
)
from agent.start import StartSpec


def worker(tmp_path: Path, **payload: object) -> ProcessWorker:
    w = ProcessWorker(
        41,
        StartSpec.from_json({"worker": "w-0", "attempt": 1, **payload}),
        WorkerLog(tmp_path / "logs", "41"),
        tmp_path / "workers" / "41",
    )
    w.keep()
    w.log.begin()
    w.home.mkdir(mode=0o700)
    w.started = True
    return w


def test_an_appended_file_counts_its_last_complete_line(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    path.write_text("0\n10\n20\n")
    assert read_progress_file(path) == ProgressRead(ProgressReport(step=20), settled=True)
    with path.open("a") as f:
        f.write(json.dumps({"step": 30, "loss": 0.25}) + "\n")
    assert read_progress(path) == ProgressReport(step=30, loss=0.25)


def test_a_last_line_still_being_written_waits_for_the_next_look(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    path.write_text("0\n10\n2")  # "20\n" half written: 10 counts meanwhile, looked at again
    assert read_progress_file(path) == ProgressRead(ProgressReport(step=10), settled=False)
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    assert read_progress_file(path) == ProgressRead(ProgressReport(step=1), settled=False)
    path.write_text('{"step": ')  # the SDK's file, half written (it replaces it whole)
    assert read_progress_file(path) == ProgressRead(None, settled=False)
    path.write_text("")  # `echo 120 >` truncated it and has not written yet
    assert read_progress_file(path) == ProgressRead(None, settled=False)


def test_a_whole_file_of_one_report_counts_without_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    path.write_text("120")  # echo -n 120 >
    assert read_progress_file(path) == ProgressRead(ProgressReport(step=120), settled=True)
    path.write_text(json.dumps({"step": 7, "checkpoint_step": 5}, indent=2))  # pretty JSON
    assert read_progress(path) == ProgressReport(step=7, checkpoint_step=5)
    path.write_text("120\n")
    assert read_progress(path) == ProgressReport(step=120)


def test_lines_that_are_not_reports_are_passed_over(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    path.write_text("5\nepoch done\n")
    assert read_progress_file(path) == ProgressRead(ProgressReport(step=5), settled=True)
    path.write_text("[1, 2]\nnull\n")
    assert read_progress_file(path) == ProgressRead(None, settled=True)


def test_a_huge_appended_file_is_read_from_its_end_only(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    with path.open("w") as f:
        for step in range(400_000):  # about 2.6 MB
            f.write(f"{step}\n")
    assert path.stat().st_size > 10 * PROGRESS_TAIL_BYTES
    assert read_progress(path) == ProgressReport(step=399_999)
    # One line longer than what is read: no report from the piece of it read.
    path.write_text("1" * (PROGRESS_TAIL_BYTES + 10) + "\n")
    assert read_progress_file(path) == ProgressRead(None, settled=True)


def test_a_link_or_a_fifo_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("42\n")
    link = tmp_path / "progress"
    link.symlink_to(secret)
    assert read_progress(link) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_progress(fifo) is None  # and it did not block


def test_appending_and_overwriting_report_the_same_steps(tmp_path: Path) -> None:
    now = [1000.0]
    sampler = Sampler(None, clock=lambda: now[0])
    appends = worker(tmp_path / "a", gpu_ids=[0])
    overwrites = worker(tmp_path / "o", gpu_ids=[1])
    overwrites.worker_id = 42
    steps: dict[int, list[int]] = {41: [], 42: []}
    for step in range(0, 100, 10):
        with appends.progress_file.open("a") as f:
            f.write(f"{step}\n")
        overwrites.progress_file.write_text(f"{step}\n")
        now[0] += 5
        look = sampler.look([appends, overwrites])
        for p in look.progress:
            steps[p.worker_id].append(p.step)
        busy = [s.value for s in look.samples if s.metric == "task_gpu_utilization_ratio"]
        assert busy == [0.95, 0.95]
    assert steps[41] == steps[42] == list(range(0, 100, 10))


def test_a_report_is_dated_when_the_file_changed_and_output_when_it_was_written(
    tmp_path: Path,
) -> None:
    sampler = Sampler(None, clock=lambda: 2_000_000_000.0)
    w = worker(tmp_path)
    w.progress_file.write_text("3\n")
    os.utime(w.progress_file, (1_700_000_000.5, 1_700_000_000.5))
    [report] = sampler.look([w]).progress
    assert (report.step, report.at_ms) == (3, 1_700_000_000_500)
    w.log.append(b"a line\n", at_ms=1_700_000_004_250)
    [output] = sampler.look([w]).progress
    assert not output.HasField("step") and output.at_ms == 1_700_000_004_250
    # A file dated in the future (touch -d) is progress now, not later.
    w.progress_file.write_text("4\n")
    os.utime(w.progress_file, (2_100_000_000, 2_100_000_000))
    [report] = sampler.look([w]).progress
    assert report.at_ms == 2_000_000_000_000


def test_the_file_is_read_once_more_as_the_worker_ends(tmp_path: Path) -> None:
    # issue 23: a rank that crashes between two looks took its last steps and its checkpoint
    # with it; they are sent before its end, for its run's rework
    now = [1000.0]
    sampler = Sampler(None, clock=lambda: now[0])
    w = worker(tmp_path, gpu_ids=[0])
    w.progress_file.write_text("7\n")
    [seen] = sampler.look([w]).progress
    assert seen.step == 7
    assert sampler.last_report(w) is None  # nothing new since that look
    with w.progress_file.open("a") as f:
        f.write(json.dumps({"step": 24, "checkpoint_step": 19}) + "\n")
    now[0] += 2
    last = sampler.last_report(w)
    assert last is not None
    assert (last.step, last.checkpoint_step, last.attempt) == (24, 19, 1)
    other = worker(tmp_path / "other")
    assert sampler.last_report(other) is None  # never looked at: nothing to compare with


def test_a_step_out_of_range_is_not_a_report(tmp_path: Path) -> None:
    # a hostile workload: a negative step, or one past what the server keeps (64-bit signed),
    # in its file; the agent neither sends it nor fails its looks or its last read at the end
    hostile = (
        "-1\n",
        f"{2**63}\n",
        json.dumps({"step": 10, "checkpoint_step": -5}) + "\n",
        json.dumps({"step": 2**64 + 7}) + "\n",
    )
    for n, text in enumerate(hostile):
        assert parse_progress(text) is None, text
        now = [1000.0]
        sampler = Sampler(None, clock=lambda now=now: now[0])
        w = worker(tmp_path / str(n))
        w.progress_file.write_text("3\n")
        [seen] = sampler.look([w]).progress
        assert seen.step == 3
        w.progress_file.write_text(text)
        now[0] += 5
        assert sampler.look([w]).progress == []  # not a report: nothing sent, no exception
        assert sampler.last_report(w) is None
    largest = parse_progress(f"{2**63 - 1}\n")
    assert largest is not None and largest.step == 2**63 - 1  # the largest the server keeps
