"""The console's screenshots in docs/screenshots/, taken from a demo that has run for minutes
(issue 21): `astraeus up --demo` on a temporary data folder and free ports, left to run (the
stall example needs its two minutes of steps and its two of stall timeout; by then the OOM kill
and the failure have happened, the gang has a loss curve and the notebook is idle), then Debian's
chromium signs in and captures each page at 1280 by 800. Everything it started is stopped at the
end: the server, its agent and the agent's workers (their shims), checked with pgrep.

    .venv/bin/python scripts/screenshots.py [--minutes 6] [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent import shim  # noqa: E402
from agent.executor import end_left_workers  # noqa: E402
from agent.identity import WorkloadUsers, workload_dir  # noqa: E402
from tests.e2e.browser import CHROMIUM, DIST, VIEWPORT, chromium, sync_api  # noqa: E402

ASTRAEUS = str(Path(sys.executable).parent / "astraeus")
WORKSPACE = "/o/default/w/default"
# Submitted once the demo's runs hold every GPU but the two the failed ones gave back: it asks
# for four, so it waits (the pending run's screenshot).
PENDING = {
    "name": "eval-sweep",
    "gpus": 4,
    "cpu": 0.25,
    "command": ["python3", str(ROOT / "examples" / "train.py")],
}
DEMO_RUNS = ("llama-sft", "crash", "big-batch", "notebook", "hang")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Demo:
    """`astraeus up --demo` on a data folder of its own and free ports."""

    def __init__(self, folder: Path) -> None:
        self.data_dir = folder / "data"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = {
            **os.environ,
            "ASTRAEUS_DATA_DIR": str(self.data_dir),
            "ASTRAEUS_PORT": str(port),
            "ASTRAEUS_AGENT_PORT": str(free_port()),
            "ASTRAEUS_CONSOLE_DIR": str(DIST),
        }
        self.env.pop("ASTRAEUS_DATABASE_URL", None)
        self.log = folder / "up.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.token = ""

    def start(self) -> None:
        self.process = subprocess.Popen(
            [ASTRAEUS, "up", "--demo"],
            env=self.env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.wait_for(lambda: self.answers(), 90, "astraeus up did not answer")
        self.token = (self.data_dir / "admin-token").read_text().strip()

    def answers(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.tail()
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def wait_for(self, done: Callable[[], bool], seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                raise SystemExit(f"{what}:\n{self.tail()}")
            time.sleep(1)

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        answer = httpx.post(
            f"{self.url}/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        ).json()
        if "errors" in answer:
            raise SystemExit(f"GraphQL refused {query!r}: {answer['errors']}")
        return dict(answer["data"])

    def states(self) -> dict[str, str]:
        runs = self.graphql("{ runs(all: true) { name state } }")["runs"]
        return {r["name"]: r["state"] for r in runs}

    def submit(self, spec: dict[str, Any]) -> None:
        answer = self.graphql(
            "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }", s=spec
        )
        if answer["createRun"]["errors"]:
            raise SystemExit(f"{spec['name']} not submitted: {answer['createRun']['errors']}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def workloads(self) -> Path:
        """Where the local agent's workers live (agent/identity.py: the data folder, or a
        folder of /var/lib of its own when other users could not reach into it)."""
        return workload_dir(self.data_dir / "agent", WorkloadUsers())

    def stop(self) -> None:
        """SIGINT to `astraeus up` (it ends its agent), then the workers the agent leaves
        running by design: their shims and process groups."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        workloads = self.workloads()
        end_left_workers(self.data_dir / "agent")
        if workloads != self.data_dir / "agent":
            shutil.rmtree(workloads, ignore_errors=True)

    def worker_groups(self) -> list[str]:
        """The process groups of the workers the agent started (each leads its own)."""
        groups = []
        for pid_file in self.workloads().glob(f"workers/*/{shim.WORKER_PID}"):
            with contextlib.suppress(OSError):
                groups.append(pid_file.read_text().strip())
        return groups

    def left(self, groups: list[str]) -> list[str]:
        """Processes still running of this demo: the server, its agent and the shims name its
        folders; the workers are in their process groups."""
        asked = [["pgrep", "-af", str(self.data_dir)], ["pgrep", "-af", str(self.workloads())]]
        asked += [["pgrep", "-a", "-g", ",".join(groups)]] if groups else []
        found: list[str] = []
        for command in asked:
            found += subprocess.run(command, capture_output=True, text=True).stdout.splitlines()
        return found


@contextlib.contextmanager
def demo(folder: Path) -> Iterator[Demo]:
    running = Demo(folder)
    try:
        running.start()
        yield running
    finally:
        groups = running.worker_groups()
        running.stop()
        for _ in range(10):  # a killed process is gone within moments
            if not running.left(groups):
                break
            time.sleep(0.5)
        if left := running.left(groups):
            raise SystemExit("still running after the demo stopped:\n" + "\n".join(left))
        print("stopped: astraeus up, its agent and its workers (pgrep finds none)")


def let_it_run(running: Demo, minutes: float) -> None:
    """Until the demo has run for ``minutes``; the waiting run goes in once the failed ones
    gave their GPUs back."""
    started = time.monotonic()
    running.wait_for(lambda: set(DEMO_RUNS) <= set(running.states()), 90, "the demo never ran")
    running.wait_for(
        lambda: {running.states()[n] for n in ("crash", "big-batch")} == {"Failed"},
        120,
        "crash and big-batch never failed",
    )
    running.submit(PENDING)
    said = 0.0
    while (waited := time.monotonic() - started) < minutes * 60:
        if waited - said >= 60:
            said = waited
            states = ", ".join(f"{n} {s}" for n, s in sorted(running.states().items()))
            print(f"  {waited / 60:.0f} min: {states}", flush=True)
        time.sleep(5)


class Camera:
    """A 1280 by 800 page signed in to the demo; each shot saved and said."""

    def __init__(self, page: Any, running: Demo, out: Path) -> None:
        self.page, self.url, self.out = page, running.url, out
        page.goto(f"{self.url}/")
        page.get_by_label("API token").fill(running.token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(re.compile(r".*/o/default/w/default/goodput$"))

    def open(self, path: str) -> None:
        self.page.goto(f"{self.url}{WORKSPACE}{path}")

    def shot(self, name: str) -> None:
        self.page.wait_for_load_state("networkidle")
        self.page.wait_for_timeout(500)  # the charts' last frame
        path = self.out / name
        self.page.screenshot(path=str(path), full_page=True)
        print(f"  {path}", flush=True)


def goodput(camera: Camera) -> None:
    page = camera.page
    camera.open("/goodput")
    page.locator('tr[data-row="llama-sft"]').wait_for()
    camera.shot("goodput.png")
    page.locator('tr[data-row="hang"] .segment-stalled').click()
    panel = page.get_by_role("region", name="Stalled intervals of hang")
    panel.locator("tbody tr").first.wait_for()
    camera.shot("goodput-intervals.png")
    page.keyboard.press("Escape")
    # the chart over time (issue 23): a click on the last hour, the demo's, opens its intervals
    chart = page.get_by_role("figure", name="default, hour by hour")
    chart.locator("canvas").wait_for()
    box = chart.locator(".u-over").bounding_box()
    page.mouse.click(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    page.get_by_role("region", name="All intervals of default").locator("tbody tr").first.wait_for()
    camera.shot("goodput-over-time.png")


def pages(camera: Camera) -> None:
    page = camera.page
    camera.open("/gpus")
    page.locator("tr[data-row]").first.wait_for()
    camera.shot("gpus.png")
    camera.open("/events")
    page.get_by_role("table", name="Events").locator("tbody tr").first.wait_for()
    camera.shot("events.png")


def train_run(camera: Camera) -> None:
    page = camera.page
    camera.open("/runs/llama-sft")
    page.get_by_role("table", name="Workers").locator('tr[data-row="llama-sft-0"]').wait_for()
    camera.shot("run-workers.png")
    page.get_by_role("button", name="Log of llama-sft-0").click()
    page.locator(".log-line", has_text="loss").first.wait_for()
    camera.shot("run-logs.png")
    page.get_by_role("tab", name="Metrics").click()
    page.locator('figure[data-metric="task_gpu_utilization_ratio"] .u-wrap').wait_for(
        timeout=45_000
    )
    camera.shot("run-metrics.png")
    page.get_by_role("tab", name="History").click()
    page.get_by_role("table", name="History").locator("tbody tr").first.wait_for()
    camera.shot("run-history.png")


def other_runs(camera: Camera) -> None:
    page = camera.page
    camera.open("/runs/crash")
    page.get_by_role("region", name="Why it failed").wait_for()
    camera.shot("run-failed.png")
    camera.open(f"/runs/{PENDING['name']}")
    page.get_by_role("region", name="Why it waits").wait_for()
    camera.shot("run-pending.png")
    camera.open("/workers/local/hang-0")
    page.get_by_role("heading", name="hang-0").wait_for()
    page.locator(".log-line").first.wait_for()
    camera.shot("worker.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=6, help="how long the demo runs first")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    if sync_api is None or not Path(CHROMIUM).exists():
        raise SystemExit("Debian's chromium and playwright are needed: make browser")
    if not (DIST / "index.html").is_file():
        raise SystemExit("the console is not built: make console")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="astraeus-screenshots-") as folder,
        demo(Path(folder)) as running,
    ):
        print(f"astraeus up --demo at {running.url}; {args.minutes:g} minutes", flush=True)
        let_it_run(running, args.minutes)
        with chromium() as browser:
            context = browser.new_context(viewport=VIEWPORT)
            camera = Camera(context.new_page(), running, out)
            for take in (goodput, pages, train_run, other_runs):
                take(camera)
            context.close()


if __name__ == "__main__":
    main()
