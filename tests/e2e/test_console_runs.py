"""The console's run and worker pages in headless Chromium against `astraeus up` with its local
agent and real runs (issue 8): a followed log shows a new line within 2 s, Find… and Errors only
filter, Download saves <worker>.log, a failed run shows its failure panel and the seed's advice
(a run at its time limit too, with its last lines: issue 20), Its log opens that worker's log;
the Workers tab says where each worker is or ran, an image run on process agents says why it
does not start, an ended worker's network chart why it has no samples (issue 36); a run's idle
policy in its readout and the goodput page's Idle GPUs given back (issue 41); screenshots of
each tab and of a worker's page."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent import cgroups
from tests.e2e.browser import NEEDS_CHROMIUM, console_dir, screenshots, sign_in
from tests.e2e.live import Server, running
from tests.support.http import HTTP

pytestmark = [NEEDS_CHROMIUM]

# A line every half second with the time it was written; every fifth an error, every fifth
# another error-like line that does not say error (seed L-7: Errors only leaves it out).
CHATTY = """\
import time, astraeus_progress
for i in range(240):
    if i % 5 == 3:
        print("Traceback (most recent call last):", flush=True)
    elif i % 5 == 4:
        print(f"CUDA error: injected {i} at {time.time():.3f}", flush=True)
    else:
        print(f"tick {i} at {time.time():.3f}", flush=True)
    astraeus_progress.report(i)
    time.sleep(0.5)
"""
BROKEN = """\
print("loading the data set", flush=True)
print("Traceback (most recent call last):", flush=True)
print("RuntimeError: boom", flush=True)
raise SystemExit(1)
"""


def create(server: Server, token: str, spec: dict[str, Any]) -> None:
    answer = HTTP.post(
        f"{server.url}/graphql",
        json={
            "query": "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }",
            "variables": {"s": spec},
        },
        headers={"Authorization": f"Bearer {token}"},
    ).json()
    assert answer["data"]["createRun"]["errors"] == [], answer


def gql(server: Server, token: str, query: str) -> dict[str, Any]:
    answer = HTTP.post(
        f"{server.url}/graphql", json={"query": query}, headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert "errors" not in answer, answer
    return dict(answer["data"])


def until_state(server: Server, token: str, run: str, state: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = HTTP.get(
            f"{server.url}/v1/jobs/{run}", headers={"Authorization": f"Bearer {token}"}
        ).json()
        if found.get("status") == state:
            return
        time.sleep(0.3)
    raise AssertionError(f"{run} never became {state}")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    root = tmp_path_factory.mktemp("console-runs")
    with running(root / "data", console_dir=console_dir()) as (server, token):
        create(server, token, {"name": "chatty", "gpus": 1, "command": ["python3", "-c", CHATTY]})
        create(
            server,
            token,
            {
                "name": "broken",
                "gpus": 1,
                "restart_policy": "never",
                "command": ["python3", "-c", BROKEN],
            },
        )
        until_state(server, token, "chatty", "Running")
        until_state(server, token, "broken", "Failed")
        yield server, token


# Resolves with how long ago (seconds) the newest line the page shows was written, as soon as
# a new line appears.
NEW_LINE_AGE = """() => new Promise((resolve) => {
  const pre = document.querySelector("pre.log");
  const seen = pre.querySelectorAll(".log-line").length;
  const look = new MutationObserver(() => {
    const lines = pre.querySelectorAll(".log-line");
    if (lines.length <= seen) return;
    const written = /at (\\d+\\.\\d+)$/.exec(lines[lines.length - 1].textContent);
    if (!written) return;
    look.disconnect();
    resolve(Date.now() / 1000 - parseFloat(written[1]));
  });
  look.observe(pre, { childList: true, subtree: true });
})"""


def test_following_a_running_workers_log(
    live: tuple[Server, str], page: Any, tmp_path: Path
) -> None:
    # seed L-5, L-6, L-7, L-8: the Logs tab follows one worker (a new line within 2 s), Find…
    # filters its lines, Errors only, Download
    server, token = live
    shots = screenshots(tmp_path)
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/runs/chatty")
    row = page.get_by_role("table", name="Workers").locator('tr[data-row="chatty-0"]')
    row.wait_for()
    # seed L-26, issue 36: Machine and GPUs say where it is: its machine and the GPU ids it
    # holds, as the API's placement has them
    placed = HTTP.get(
        f"{server.url}/v1/tasks/chatty-0", headers={"Authorization": f"Bearer {token}"}
    ).json()["placement"]
    assert row.locator('[data-figure="machine"]').inner_text() == placed["machine"]
    assert row.locator('[data-figure="gpus"]').inner_text() == ", ".join(
        str(i) for i in placed["gpu_ids"]
    )
    page.screenshot(path=str(shots / "run-workers.png"), full_page=True)

    page.get_by_role("button", name="Log of chatty-0").click()
    page.wait_for_url("**/runs/chatty?tab=logs&worker=chatty-0")
    page.locator(".log-line", has_text="tick").first.wait_for()
    ages = [page.evaluate(NEW_LINE_AGE) for _ in range(3)]
    assert max(ages) < 2.0, ages  # issue 8: a new line within 2 s of being written

    errors = page.locator('[data-figure="errors"]')
    page.wait_for_function(
        "() => /^[1-9]\\d* error-like/.test("
        "document.querySelector('[data-figure=\"errors\"]').textContent)"
    )
    assert errors.inner_text().endswith(("error-like line", "error-like lines"))
    page.get_by_label("Errors only").check()
    # seed L-7: the lines containing error, not "Traceback (most recent call last):"
    shown = page.locator(".log-line").all_inner_texts()
    assert shown and all(line.startswith("CUDA error: injected") for line in shown)
    # seed L-8: Download saves what is shown, not every line kept
    page.get_by_label("Follow").uncheck()
    shown = page.locator(".log-line").all_inner_texts()
    with page.expect_download() as download:
        page.get_by_role("button", name="Download").click()
    errors_only = tmp_path / "errors-only.log"
    download.value.save_as(errors_only)
    assert errors_only.read_text().splitlines() == shown
    page.get_by_label("Follow").check()
    page.get_by_label("Errors only").uncheck()
    page.get_by_label("Find…").fill("tick 1 ")
    assert page.locator(".log-line").all_inner_texts()[0].startswith("tick 1 at ")
    page.get_by_label("Find…").fill("")
    page.screenshot(path=str(shots / "run-logs.png"), full_page=True)

    with page.expect_download() as download:
        page.get_by_role("button", name="Download").click()
    assert download.value.suggested_filename == "chatty-0.log"
    saved = tmp_path / "chatty-0.log"
    download.value.save_as(saved)
    assert saved.read_text().startswith("tick 0 at ")

    page.get_by_role("tab", name="Metrics").click()
    page.locator('figure[data-metric="task_gpu_utilization_ratio"] .u-wrap').wait_for(
        timeout=45_000
    )
    # seed L-52: the charts show the run's life so far, not a fixed hour
    assert page.get_by_label("Range", exact=True).evaluate("s => s.selectedOptions[0].text") == (
        "Its life so far"
    )
    page.screenshot(path=str(shots / "run-metrics.png"), full_page=True)
    page.get_by_role("tab", name="History").click()
    # seed L-43: the run's History tab lists its events, newest first
    history = page.get_by_role("table", name="History")
    history.locator("tbody tr").first.wait_for()
    rows = [r.split("\t")[1:] for r in history.locator("tbody tr").all_inner_texts()]
    assert rows[-1] == ["run.state", "chatty", "Pending", "Run created"]
    assert ["worker.state", "chatty-0", "Running", "Container running"] in rows
    page.screenshot(path=str(shots / "run-history.png"), full_page=True)


# Each rank prints 6 000 lines at once, then one every half second, its GPU busy.
PAIR = """\
import json, os, pathlib, time
rank = os.environ["RANK"]
progress = pathlib.Path(os.environ["ASTRAEUS_PROGRESS_FILE"])
for i in range(6000):
    print(f"rank {rank} line {i} at {time.time():.3f}")
i = 6000
while True:
    print(f"rank {rank} line {i} at {time.time():.3f}", flush=True)
    progress.write_text(json.dumps({"step": i, "gpu_utilization": [0.97]}))
    i += 1
    time.sleep(0.5)
"""

# Resolves with how long ago (seconds) the newest line shown was written, as soon as a new one
# is last (the view keeps 5 000 lines: their count no longer grows); -1 after 10 s without one.
NEW_LAST_LINE_AGE = """() => new Promise((resolve) => {
  const pre = document.querySelector("pre.log");
  const lastLine = () => {
    const lines = pre.querySelectorAll(".log-line");
    return lines.length ? lines[lines.length - 1].textContent : null;
  };
  const before = lastLine();
  const look = new MutationObserver(() => {
    const now = lastLine();
    const written = now === before ? null : /at (\\d+\\.\\d+)$/.exec(now);
    if (!written) return;
    look.disconnect();
    resolve(Date.now() / 1000 - parseFloat(written[1]));
  });
  look.observe(pre, { childList: true, subtree: true, characterData: true });
  setTimeout(() => { look.disconnect(); resolve(-1); }, 10000);
})"""
# The lines of the log shown, at one moment.
SHOWN_LINES = "() => [...document.querySelectorAll('pre.log .log-line')].map(l => l.textContent)"
# Whether the last line shown is in view, in the log's box and in the window.
END_IN_VIEW = """() => {
  const pre = document.querySelector("pre.log");
  const lines = pre.querySelectorAll(".log-line");
  if (!lines.length) return false;
  const last = lines[lines.length - 1].getBoundingClientRect();
  const box = pre.getBoundingClientRect();
  return last.bottom <= Math.min(box.bottom, window.innerHeight) + 1
    && last.top >= Math.max(box.top, 0) - 1;
}"""
HOPPER_ONLY = "No samples in this range (this figure is measured on Hopper GPUs with NVML)."


@pytest.fixture(scope="module")
def pair(live: tuple[Server, str]) -> Iterator[tuple[Server, str]]:
    """pair: two workers of a GPU each, a time limit, priority 40, three restarts at most;
    running while the module's tests read it, stopped after."""
    server, token = live
    spec = {
        "name": "pair",
        "workers": 2,
        "gpus": 1,
        "priority": 40,
        "max_restarts": 3,
        "time_limit": "1h",
        "command": ["python3", "-c", PAIR],
    }
    create(server, token, spec)
    try:
        until_state(server, token, "pair", "Running")
        yield server, token
    finally:
        gql(server, token, 'mutation { stopRun(name: "pair") { errors { message } } }')


def test_a_two_worker_runs_page_its_readout_its_log_and_its_charts(
    pair: tuple[Server, str], page: Any, tmp_path: Path
) -> None:
    # seed L-24: the page leads with its state and its sentence, who started it and when.
    # seed L-25: the readout: Workers (running of total), GPUs, Machines, Time left (it has a
    # time limit), Using now (GPU %, cores, memory), Priority with how it starts and fails.
    # seed L-4: Log on a row of the Workers tab opens that worker's log, its last 5 000 lines;
    # the `Log ·` selector lists the run's workers (picking one: the test after this one).
    # seed L-5: Follow is on by default, a new line shows within 4 s, the end kept in view.
    # seed L-37: the Metrics tab charts CPU, memory, GPU utilisation, GPU memory, tensor cores,
    # SM activity and memory bandwidth, a series per worker (the last three only where the
    # GPUs measure them, Hopper's: none here, and the chart says so).
    server, token = pair
    run = gql(server, token, '{ run(name: "pair") { state reason createdBy createdAt } }')
    run = run["run"]
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/runs/pair")
    head = page.locator("header.page-head")
    head.locator(".state").wait_for()
    assert head.get_by_role("heading").inner_text() == "pair Running"
    assert head.locator(".sentence").inner_text() == run["reason"] == "2 of 2 workers running"
    created = datetime.fromisoformat(run["createdAt"])
    assert head.locator(".muted").inner_text() == (
        f"Started by {run['createdBy']} at {created:%Y-%m-%d %H:%M:%S} UTC · cluster local"
    )
    readout = page.get_by_label("Readout")
    figures = {
        f: readout.locator(f'[data-figure="{f}"]').text_content()
        for f in ("workers", "gpus", "machines", "priority")
    }
    assert figures == {
        "workers": "2 of 2",
        "gpus": "2",
        "machines": "1",
        "priority": "40 2 workers start together; restarts on failure, up to 3 in a row",
    }
    clock = readout.locator('[data-figure="clock"]')
    assert clock.locator("xpath=preceding-sibling::dt").inner_text() == "Time left"
    assert re.fullmatch(r"[1-5]?\dm \d+s", clock.inner_text()), clock.inner_text()
    page.wait_for_function(
        "() => /^97% GPU · \\d+\\.\\d cores · .+/.test("
        "document.querySelector('[data-figure=\"using\"]').textContent)",
        timeout=45_000,
    )

    row = page.get_by_role("table", name="Workers").locator('tr[data-row="pair-1"]')
    row.get_by_role("button", name="Log of pair-1").click()
    page.wait_for_url("**/runs/pair?tab=logs&worker=pair-1")
    assert page.get_by_label("Follow").is_checked()
    page.wait_for_function("() => document.querySelectorAll('pre.log .log-line').length >= 5000")
    lines = page.evaluate(SHOWN_LINES)
    numbers = [int(re.fullmatch(r"rank 1 line (\d+) at [\d.]+", t)[1]) for t in lines]  # type: ignore[index]
    assert len(numbers) == 5000
    assert numbers == list(range(numbers[0], numbers[0] + 5000))
    assert numbers[0] >= 1000  # its first lines are no longer shown
    ages = [page.evaluate(NEW_LAST_LINE_AGE) for _ in range(3)]
    assert min(ages) >= 0 and max(ages) < 4.0, ages
    page.wait_for_function(END_IN_VIEW, timeout=2_000)
    page.screenshot(path=str(screenshots(tmp_path) / "run-pair-log.png"))
    chooser = page.get_by_label("Log ·")
    assert chooser.evaluate("s => [...s.options].map(o => o.text)") == ["pair-0", "pair-1"]
    assert chooser.input_value() == "pair-1"

    page.get_by_role("tab", name="Metrics").click()
    charts = page.locator("figure.chart[data-metric]")
    charts.first.wait_for()
    assert charts.evaluate_all("fs => fs.map(f => f.dataset.metric)")[:7] == [
        "task_cpu_usage_cores",
        "task_memory_used_bytes",
        "task_gpu_utilization_ratio",
        "task_gpu_memory_used_bytes",
        "task_gpu_tensor_active_ratio",
        "task_gpu_sm_active_ratio",
        "task_gpu_dram_active_ratio",
    ]
    titles = charts.locator("figcaption").all_inner_texts()
    assert [t.split(" (")[0] for t in titles][:7] == [
        "CPU",
        "Memory",
        "GPU utilisation",
        "GPU memory",
        "Tensor cores",
        "SM activity",
        "Memory bandwidth",
    ]
    for metric in CHARTED_HERE:
        chart = page.locator(f'figure[data-metric="{metric}"]')
        chart.locator(".u-wrap").wait_for(timeout=45_000)
        labels = chart.locator(".u-legend .u-label").all_inner_texts()
        # a series per worker (per GPU of a worker: "pair-0 / 1"), the limit's beside it
        workers = {label.split(" / ")[0] for label in labels if label.startswith("pair-")}
        assert workers == {"pair-0", "pair-1"}, (metric, labels)
    for metric in HOPPERS:
        chart = page.locator(f'figure[data-metric="{metric}"]')
        assert chart.locator("p.empty").inner_text() == HOPPER_ONLY, metric
    page.screenshot(path=str(screenshots(tmp_path) / "run-pair-metrics.png"), full_page=True)


def test_the_log_selector_shows_the_worker_picked(pair: tuple[Server, str], page: Any) -> None:
    # seed L-4: the `Log ·` selector picks another worker of the run, whose log is then shown
    # and followed
    server, token = pair
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/runs/pair?tab=logs&worker=pair-1")
    page.locator(".log-line", has_text="rank 1 line").first.wait_for()
    page.get_by_label("Log ·").select_option("pair-0")
    page.wait_for_url("**/runs/pair?tab=logs&worker=pair-0")
    page.locator(".log-line", has_text="rank 0 line").first.wait_for(timeout=10_000)
    assert page.get_by_label("Follow").is_checked()
    assert not [t for t in page.evaluate(SHOWN_LINES) if not t.startswith("rank 0 line")]


# What the local agent's simulated GPUs and processes measure, and what only Hopper's NVML does.
CHARTED_HERE = (
    "task_cpu_usage_cores",
    "task_memory_used_bytes",
    "task_gpu_utilization_ratio",
    "task_gpu_memory_used_bytes",
)
HOPPERS = ("task_gpu_tensor_active_ratio", "task_gpu_sm_active_ratio", "task_gpu_dram_active_ratio")


def test_a_failed_run_shows_its_failure_and_advice(
    live: tuple[Server, str], page: Any, tmp_path: Path
) -> None:
    # seed L-48, L-49, L-50: the failure panel turns the reason into advice and offers Its log
    server, token = live
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/runs/broken")
    panel = page.get_by_role("region", name="Why it failed")
    panel.wait_for()
    assert panel.locator(".sentence").inner_text().startswith("Worker broken-0 failed")
    assert panel.locator('[data-figure="advice"]').inner_text() == "Your program: its log."
    # issue 23: its ETTR beside its goodput (none yet, or what the ledgers have counted), and
    # its GPU time hour by hour
    ettr = page.locator('[data-figure="ettr"]').inner_text()
    assert re.fullmatch(r"ETTR (\d+%|—) \(productive time over its GPUs' wall time .*\)", ettr)
    page.get_by_role("figure", name="broken, hour by hour").wait_for()
    # issue 38: no Slurm readout for a run of the agent's cluster
    assert page.get_by_role("region", name="Slurm").count() == 0
    page.screenshot(path=str(screenshots(tmp_path) / "run-failed.png"), full_page=True)
    panel.get_by_role("button", name="Its log").click()
    page.wait_for_url("**/runs/broken?tab=logs&worker=broken-0")
    page.locator(".log-line", has_text="RuntimeError: boom").wait_for()


# Steps until it is stopped: its time limit ends it.
ENDLESS = """\
import time
for i in range(100000):
    print(f"step {i}", flush=True)
    time.sleep(0.2)
"""


def test_a_run_at_its_time_limit_shows_its_failure_and_its_last_lines(
    live: tuple[Server, str], page: Any, tmp_path: Path
) -> None:
    # issue 20: a time-limit failure had no failure panel (failedWorker and advice null);
    # seed L-54, L-21: the panel's advice and the snapshot's last lines
    server, token = live
    spec = {"name": "timed", "gpus": 1, "time_limit": "3s", "command": ["python3", "-c", ENDLESS]}
    create(server, token, spec)
    until_state(server, token, "timed", "Failed")
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/runs/timed")
    panel = page.get_by_role("region", name="Why it failed")
    panel.wait_for()
    assert panel.locator(".sentence").inner_text() == "Exceeded its time limit of 3s"
    assert panel.locator('[data-figure="advice"]').inner_text() == (
        "The time limit: raise it, or checkpoint and resume."
    )
    panel.get_by_text("The last lines it wrote before it failed").click()
    tail = panel.locator("pre.log").inner_text()
    assert "step 1" in tail, tail
    page.screenshot(path=str(screenshots(tmp_path) / "run-time-limit.png"), full_page=True)
    panel.get_by_role("button", name="Its log").click()
    page.wait_for_url("**/runs/timed?tab=logs&worker=timed-0")


# Reports one step, says so, then hangs without a word: it stalls.
HANGS = """\
import time, astraeus_progress
astraeus_progress.report(1)
print("step 1, then a hang", flush=True)
time.sleep(3600)
"""


def test_a_run_restarting_after_a_stall_shows_the_restarting_in_a_loop_panel(
    live: tuple[Server, str], page: Any, tmp_path: Path
) -> None:
    # issue 20: a worker restarted for stalls had no snapshot and the page no loop panel;
    # seed L-68: restarts, when the next attempt is, and the last failure's output
    server, token = live
    spec = {
        "name": "hangs",
        "gpus": 1,
        "stall_timeout": "3s",
        "max_restarts": 3,
        "command": ["python3", "-c", HANGS],
    }
    create(server, token, spec)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = HTTP.get(
            f"{server.url}/v1/jobs/hangs", headers={"Authorization": f"Bearer {token}"}
        ).json()
        if job["restart_loop"] and job["restart_loop"]["last_failure"]:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"hangs never restarted for a stall: {job}")
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/runs/hangs")
    panel = page.get_by_role("region", name="Restarting in a loop")
    panel.wait_for()
    # issue 36: its own max_restarts, in the count and in the rule (it said "after 10" always)
    assert panel.locator('[data-figure="restarts"]').inner_text() == "1 of 3"
    assert panel.locator('[data-figure="loop-rule"]').inner_text() == (
        "Each failure doubles the wait, up to 5 minutes; after 3 restarts in a row it gives up; "
        "10 minutes running resets the count."
    )
    assert panel.locator('[data-figure="loop-reason"]').inner_text() == (
        "Stalled: no progress for 3s"
    )
    assert panel.locator('[data-figure="loop-advice"]').inner_text() == (
        "Check the metrics around the failure: memory climbing to the limit, a GPU at 0% (a "
        "hang), network traffic stopping."
    )
    assert "step 1, then a hang" in panel.locator("pre.log").inner_text()
    page.screenshot(path=str(screenshots(tmp_path) / "run-restarting.png"), full_page=True)
    # issue 21: the stall is dated from its last progress and found later: its History row
    # shows both times
    events = HTTP.post(
        f"{server.url}/graphql",
        json={"query": '{ events(name: "hangs") { events { id reason createdAt foundAt } } }'},
        headers={"Authorization": f"Bearer {token}"},
    ).json()["data"]["events"]["events"]
    stall = next(e for e in events if e["reason"].startswith("Stalled: no progress"))
    happened = datetime.fromisoformat(stall["createdAt"])
    found = datetime.fromisoformat(stall["foundAt"])
    assert int(found.timestamp()) > int(happened.timestamp()), stall
    page.get_by_role("tab", name="History").click()
    row = page.get_by_role("table", name="History").locator(f'tr[data-event="{stall["id"]}"]')
    assert row.locator("td").first.inner_text() == (
        f"{happened:%Y-%m-%d %H:%M:%S} UTC\nfound {found:%Y-%m-%d %H:%M:%S} UTC"
    )
    # its restarts hold a core of this machine's few while placed: the next tests' runs need it
    gql(server, token, 'mutation { stopRun(name: "hangs") { errors { message } } }')


# Asks for more memory than its limit at once: the kernel kills it within a second.
HOG = """\
import time
print("loading", flush=True)
time.sleep(0.5)
hog = bytearray(400 * 2**20)
time.sleep(600)
"""


def test_an_oom_kill_opens_the_memory_chart_with_its_limit(
    live: tuple[Server, str], page: Any
) -> None:
    # seed L-52: OOMKilled → the Memory chart near the limit: the limit drawn as a line, the
    # worker's short life charted (its samples at start and end), not a fixed hour
    probe = cgroups.create("probe", "astraeus-console")
    if probe is None:
        pytest.skip("this machine gives the agent no control groups: no memory limit, no OOM")
    probe.remove()
    server, token = live
    spec = {
        "name": "hog",
        "gpus": 1,
        "memory_bytes": 64 * 2**20,
        "restart_policy": "never",
        "command": ["python3", "-c", HOG],
    }
    create(server, token, spec)
    until_state(server, token, "hog", "Failed")
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/runs/hog")
    panel = page.get_by_role("region", name="Why it failed")
    assert "OOMKilled" in panel.locator(".sentence").inner_text()
    panel.get_by_role("button", name="Memory chart").click()
    page.wait_for_url("**/runs/hog?tab=metrics**")
    assert (
        page.get_by_label("Range", exact=True).evaluate("s => s.selectedOptions[0].text")
        == "Its life"
    )
    memory = page.locator('figure[data-metric="task_memory_used_bytes"]')
    memory.locator(".u-wrap").wait_for(timeout=30_000)
    labels = memory.locator(".u-legend .u-label").all_inner_texts()
    assert "hog-0" in labels and "limit of hog-0" in labels, labels
    assert memory.locator("figcaption").inner_text() == "Memory (MiB)"


def test_a_workers_page(live: tuple[Server, str], page: Any, tmp_path: Path) -> None:
    # seed L-27, L-28: machine, GPU ids, what it asked for, restarts, exit code; How it was
    # started
    server, token = live
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/workers/local/chatty-0")
    page.get_by_role("heading", name="chatty-0").wait_for()
    worker = HTTP.get(
        f"{server.url}/v1/tasks/chatty-0", headers={"Authorization": f"Bearer {token}"}
    ).json()
    figures = page.get_by_label("Worker", exact=True)
    assert figures.locator('[data-figure="machine"]').inner_text() == worker["placement"]["machine"]
    assert figures.locator('[data-figure="gpu-ids"]').inner_text() == ", ".join(
        str(i) for i in worker["placement"]["gpu_ids"]
    )
    assert figures.locator('[data-figure="asked"]').inner_text().startswith("1 GPU")
    started = page.get_by_role("region", name="How it was started")
    assert "python3 -c import time" in started.inner_text()
    # seed L-9: a worker's own page has a Log tab, open first, with its log
    assert page.get_by_role("tab", name="Log", exact=True).get_attribute("aria-selected") == "true"
    page.locator(".log-line", has_text="tick").first.wait_for()
    page.screenshot(path=str(screenshots(tmp_path) / "worker.png"), full_page=True)


def test_an_ended_workers_page_says_where_it_ran(live: tuple[Server, str], page: Any) -> None:
    # issue 21: an ended worker's page showed Machine "—" and GPU ids "—" (seed L-27)
    server, token = live
    [worker] = HTTP.post(
        f"{server.url}/graphql",
        json={
            "query": '{ run(name: "broken") { workers { state machine lastPlacement '
            "{ machine gpuIds } } } }"
        },
        headers={"Authorization": f"Bearer {token}"},
    ).json()["data"]["run"]["workers"]
    assert (worker["state"], worker["machine"]) == ("Failed", None)  # it holds nothing now
    ran = worker["lastPlacement"]
    assert ran["machine"] and ran["gpuIds"], worker
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/workers/local/broken-0")
    figures = page.get_by_label("Worker", exact=True)
    ids = ", ".join(str(i) for i in ran["gpuIds"])
    assert figures.locator('[data-figure="machine"]').inner_text() == ran["machine"]
    assert figures.locator('[data-figure="gpu-ids"]').inner_text() == ids
    # seed L-38, issue 36: its network chart says why it has nothing, as the API does: the
    # process agent's workers share the host's network (it said "No samples" once it ended)
    page.get_by_role("tab", name="Metrics").click()
    network = page.locator('figure[data-metric="task_network_receive_bytes_total"]')
    assert network.locator(".not-measured").inner_text() == (
        "Not measured: this machine's agent runs processes on the host's network"
    )
    assert network.get_by_text("No samples").count() == 0
    # issue 36: its run's Workers tab keeps where it ran (Machine and GPUs said "—" and "1")
    page.goto(f"{server.url}/o/default/w/default/runs/broken")
    row = page.get_by_role("table", name="Workers").locator('tr[data-row="broken-0"]')
    assert row.locator('[data-figure="machine"]').inner_text() == ran["machine"]
    assert row.locator('[data-figure="gpus"]').inner_text() == ids


def test_gpus_events_and_machines(live: tuple[Server, str], page: Any, tmp_path: Path) -> None:
    # seed L-39 (every GPU, its use, health and holder), L-44/L-46 (the workspace's events,
    # live), machines for the organisation's admins
    server, token = live
    shots = screenshots(tmp_path)
    sign_in(page, server, token)
    page.get_by_role("link", name="GPUs").click()
    page.wait_for_url("**/o/default/w/default/gpus")
    gpus = HTTP.post(
        f"{server.url}/graphql",
        json={"query": "{ gpus { machine index heldBy } }"},
        headers={"Authorization": f"Bearer {token}"},
    ).json()["data"]["gpus"]
    rows = page.locator("tr[data-row]")
    rows.first.wait_for()
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.row)") == [
        f"{g['machine']}/{g['index']}" for g in gpus
    ]
    held = [f"{g['machine']}/{g['index']}" for g in gpus if g["heldBy"] == "chatty"]
    holder = page.locator(f'tr[data-row="{held[0]}"] [data-figure="holder"]')
    assert holder.inner_text() == "chatty"
    page.screenshot(path=str(shots / "gpus.png"), full_page=True)

    page.get_by_role("link", name="Events").click()
    events = page.get_by_role("table", name="Events")
    events.locator("tbody tr").first.wait_for()
    create(server, token, {"name": "late", "gpus": 1, "command": ["true"]})
    # the new run's first event arrives live, on top
    page.locator("tbody tr").first.filter(has_text="late").wait_for(timeout=10_000)
    page.screenshot(path=str(shots / "events.png"), full_page=True)

    page.get_by_role("link", name="Machines").click()  # the admin's token: an admin's menu
    # (exact: "Costly machines" is a table too, whose rows name the machine as well)
    machines = page.get_by_role("table", name="Machines", exact=True)
    machines.locator('tr[data-row="local"]').wait_for()
    assert machines.locator('tr[data-row="local"]').inner_text().split("\t")[3] == "ready"
    # issue 23: the costly machines, as machineHealth ranks them (broken failed on local)
    costly = page.get_by_role("table", name="Costly machines")
    costly.locator('tr[data-row="local"]').wait_for()
    row = costly.locator('tr[data-row="local"]')
    # The page as machineHealth ranks it; the broken run fails on while the page and the query
    # are read (a fifth failure between the two read 3 against 4): read again until they agree.
    deadline = time.monotonic() + 60
    while True:
        health = gql(
            server, token, "{ machineHealth { machines { machine failureCount action } } }"
        )
        (local,) = health["machineHealth"]["machines"]
        shown = row.locator('[data-figure="action"]').inner_text()
        failures = row.locator('[data-figure="failures"]').inner_text()
        if shown == local["action"] and failures.startswith(str(local["failureCount"])):
            break
        assert time.monotonic() < deadline, (shown, failures, local)
        page.reload()
        row.wait_for()
    assert local["failureCount"] >= 1
    page.screenshot(path=str(shots / "machines.png"), full_page=True)


def test_a_run_that_does_not_start_says_where_to_look(
    live: tuple[Server, str], page: Any, tmp_path: Path
) -> None:
    # seed L-63: Pending with Cannot plan workers → the GPU count does not split as asked
    server, token = live
    create(server, token, {"name": "too-big", "gpus": 64, "command": ["true"]})
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/runs/too-big")
    panel = page.get_by_role("region", name="Why it waits")
    panel.wait_for()
    assert panel.locator(".sentence").inner_text().startswith("Cannot plan workers:")
    assert panel.locator('[data-figure="wait-advice"]').inner_text() == (
        "The GPU count does not split as asked: change machines or the count."
    )
    page.screenshot(path=str(screenshots(tmp_path) / "run-pending.png"), full_page=True)


def test_an_image_run_where_no_machine_runs_containers_says_why_it_does_not_start(
    live: tuple[Server, str], page: Any
) -> None:
    # issue 36: its page had no Why it does not start panel; seed L-61: the per-machine reasons
    server, token = live
    spec = {"name": "boxed", "gpus": 1, "image": "python:3.11-slim", "command": ["true"]}
    create(server, token, spec)
    try:
        sign_in(page, server, token)
        page.goto(f"{server.url}/o/default/w/default/runs/boxed")
        panel = page.get_by_role("region", name="Why it waits")
        panel.wait_for()
        assert panel.get_by_role("heading").inner_text() == "Why it does not start"
        assert panel.locator(".sentence").inner_text() == (
            "No machine runs containers: this cluster's agents run processes; drop image or add "
            "a machine with --executor docker"
        )
        assert panel.locator('[data-figure="wait-advice"]').inner_text() == (
            "The per-machine reasons: Read a pending reason."
        )
        machines = panel.get_by_role("list", name="Per machine").inner_text()
        assert machines == "local: runs processes, not containers: the run names an image"
        # not placed: the GPUs it asks for, marked so
        row = page.get_by_role("table", name="Workers").locator('tr[data-row="boxed-0"]')
        assert row.locator('[data-figure="machine"]').inner_text() == "—"
        assert row.locator('[data-figure="gpus"]').inner_text() == "1 asked"
    finally:
        gql(server, token, 'mutation { stopRun(name: "boxed") { errors { message } } }')


def test_an_idle_policy_and_the_checkpoint_advice_show_on_its_runs_page(
    live: tuple[Server, str], page: Any
) -> None:
    # issue 41: the run's readout says its idle policy (the utilization's default, 5%); the
    # goodput page's Idle GPUs given back says no policy stopped a run (none here does in 30m)
    server, token = live
    spec = {
        "name": "idler",
        "gpus": 1,
        "idle": {"for": "30m"},
        "command": ["python3", "-c", ENDLESS],
    }
    create(server, token, spec)
    try:
        sign_in(page, server, token)
        section = page.get_by_role("region", name="Idle GPUs given back")
        assert section.locator("p.empty").inner_text() == (
            "No idle policy stopped a run in the last 7 days: a run's spec may say idle: "
            '{gpu_utilization_below: 5, for: "30m"} to be stopped when every GPU it holds stays '
            "under 5% for 30 minutes."
        )
        page.goto(f"{server.url}/o/default/w/default/runs/idler")
        policy = page.get_by_label("Readout").locator('[data-figure="idle-policy"]')
        assert policy.inner_text() == "Stop when every GPU stays under 5% for 30m"
        # its checkpoint advice: it reported none (issue 41)
        advice = page.get_by_label("How often to checkpoint")
        assert advice.locator('[data-figure="checkpoint-sentence"]').inner_text() == (
            "No checkpoints measured yet: its workload reports checkpoint_step in its progress "
            "file at each checkpoint, a step at a time (two at least)"
        )
    finally:
        gql(server, token, 'mutation { stopRun(name: "idler") { errors { message } } }')


def test_run_again_opens_the_spec_under_a_new_name(live: tuple[Server, str], page: Any) -> None:
    # seed L-60: Run again opens its specification as JSON under a new name
    server, token = live
    sign_in(page, server, token)
    page.goto(f"{server.url}/o/default/w/default/runs/broken")
    page.get_by_role("button", name="Run again").click()
    spec = page.get_by_label("Specification")
    assert '"name": "broken-2"' in spec.input_value()
    spec.fill(spec.input_value().replace('"gpus": 1', '"gpus": 0, "workers": 0'))
    page.get_by_role("button", name="Submit").click()
    assert "workers: must be at least 1" in page.get_by_role("alert").inner_text()
    spec.fill(spec.input_value().replace('"gpus": 0, "workers": 0', '"gpus": 1'))
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url("**/runs/broken-2")
    page.get_by_role("heading", name="broken-2").wait_for()


def test_the_machines_page_shows_quotas_and_thresholds(live: tuple[Server, str], page: Any) -> None:
    # seed L-62 (issue 21): a workspace's quota and a cluster's alert thresholds, set by its
    # admin, read back on the Machines page (the last test here: the quota is far above what
    # the runs above ask, the threshold one no test above reads)
    server, token = live
    answer = HTTP.post(
        f"{server.url}/graphql",
        json={
            "query": """mutation {
              setQuota(workspace: "default", cluster: "local", gpus: 100) { errors { message } }
              setThreshold(cluster: "local", name: "workers_stalled", value: 3) {
                errors { message } } }"""
        },
        headers={"Authorization": f"Bearer {token}"},
    ).json()
    assert answer["data"]["setQuota"]["errors"] == [], answer
    assert answer["data"]["setThreshold"]["errors"] == [], answer
    sign_in(page, server, token)
    page.get_by_role("link", name="Machines").click()
    quotas = page.get_by_role("table", name="Quotas on local")
    assert quotas.locator('tr[data-row="default"]').inner_text().split("\t") == ["default", "100"]
    thresholds = page.get_by_role("table", name="Alert thresholds of local")
    stalled = thresholds.locator('tr[data-row="workers_stalled"]').inner_text().split("\t")
    assert stalled[:3] == ["workers_stalled", "3", "1"]
    assert stalled[3].endswith(" UTC")
    assert thresholds.locator('tr[data-row="goodput_drop.below"] td').last.inner_text() == (
        "default"
    )
