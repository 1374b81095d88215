"""The console (issue 8): the built bundle's size, and the goodput page's load time with 1 000
runs, each beside a bare baseline measured in the same run. Figures are reported, never
asserted.

The bundle. The gzip size of frontend/dist's JavaScript and CSS, against React and ReactDOM
rendering one element (frontend/bench/bare), built by the same Vite in this run.

The page. `astraeus serve` on a fresh PostgreSQL database holding 1 000 runs with 8 whole days
of hourly cells each up to this hour (productive and idle, as bench/goodput.py fills them),
the built console, and Debian's chromium through Playwright. Each trial is a new browser
context (nothing cached, the token already stored): the time from navigation to the goodput
page showing its 200 rows (the 200 that held the most, of 1 000), read in the page from
performance.now(). The baseline, in the same browser and against the same server: a bare page
served from the same origin that posts the page's own GraphQL query with fetch() and writes
the 200 rows into a table with innerHTML.
"""

from __future__ import annotations

import argparse
import gzip
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bench.common import fresh_database, median, save
from bench.goodput_report import populate_ledgers
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[1]
FRONTEND = ROOT / "frontend"
DIST = FRONTEND / "dist"
BIN = Path(sys.executable).parent
ROWS = 200


def gzip_size(folder: Path) -> dict[str, int]:
    """Bytes of the JavaScript and CSS under ``folder``, as built and gzipped: all of it, and
    what a first visit loads (Vite's entry chunk, index-*; the rest loads when needed)."""
    files = [p for p in folder.rglob("*") if p.suffix in (".js", ".css")]
    first = [p for p in files if p.name.startswith("index-")]
    return {
        "bytes": sum(p.stat().st_size for p in files),
        "gzip_bytes": sum(len(gzip.compress(p.read_bytes(), 9)) for p in files),
        "first_visit_gzip_bytes": sum(len(gzip.compress(p.read_bytes(), 9)) for p in first),
    }


def bench_bundle() -> dict[str, Any]:
    subprocess.run(
        ["npm", "run", "--silent", "build"], cwd=FRONTEND, check=True, capture_output=True
    )
    ours = gzip_size(DIST / "assets")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                "npx",
                "vite",
                "build",
                "bench/bare",
                "--config",
                "bench/bare/vite.config.js",
                "--outDir",
                out,
                "--emptyOutDir",
                "--logLevel",
                "warn",
            ],
            cwd=FRONTEND,
            check=True,
            capture_output=True,
        )
        bare = gzip_size(Path(out))
    return {
        "console": ours,
        "bare_react": bare,
        "ratio": ours["gzip_bytes"] / bare["gzip_bytes"],
        "first_visit_ratio": ours["first_visit_gzip_bytes"] / bare["gzip_bytes"],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# What the server said while it was measured (its log, kept apart from the figures): an error
# in it is a finding the benchmark names (SERVER_ERRORS), never lines among its figures.
SERVER_LOG = Path(tempfile.gettempdir()) / "astraeus-bench-console-server.log"
SERVER_ERRORS: list[str] = []


@contextmanager
def serving(url: str) -> Iterator[tuple[str, str]]:
    """`astraeus serve` on the database, with the built console; (its URL, a member's token).
    Its log goes to SERVER_LOG; each traceback's last line is kept in SERVER_ERRORS."""
    env = {
        **os.environ,
        "ASTRAEUS_DATABASE_URL": url,
        "ASTRAEUS_PORT": str(free_port()),
        "ASTRAEUS_AGENT_PORT": "0",
        "ASTRAEUS_RUN_JOBS": "false",
        "ASTRAEUS_CONSOLE_DIR": str(DIST),
        "ASTRAEUS_LOG_LEVEL": "warning",
    }
    token = subprocess.run(
        [
            str(BIN / "astraeus"),
            "token",
            "create",
            "--organization",
            "bench",
            "--workspace",
            "default",
            "--user",
            "bench",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    log = SERVER_LOG.open("w")
    server = subprocess.Popen(
        [str(BIN / "astraeus"), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{env['ASTRAEUS_PORT']}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield base, token
    finally:
        server.terminate()
        server.wait(timeout=15)
        log.close()
        SERVER_ERRORS.extend(_errors(SERVER_LOG.read_text(errors="replace")))


def _errors(log: str) -> list[str]:
    """The last line of each traceback in a server's log (the exception and its message)."""
    lines, found = log.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            rest = [x for x in lines[i + 1 :] if x and not x.startswith((" ", "\t"))]
            found.append(rest[0] if rest else line)
    return found


# The goodput page's own query (frontend/src/pages/Goodput.tsx), as the bare page posts it.
LEDGER = """allocatedGpuHours productiveGpuHours lostGpuHours waitingGpuHours goodput
  gpuHours { category gpuHours heldGpuHours } biggestLoss { category gpuHours heldGpuHours }"""
QUERY = f"""query Goodput($by: GoodputScope!, $start: DateTime, $ws: String) {{
  goodput(by: $by, start: $start, workspace: $ws) {{
    start end rowCount total {{ {LEDGER} }} rows(first: {ROWS}) {{ name ledger {{ {LEDGER} }} }}
  }}
  attention(workspace: $ws) {{ run worker kind since reason machine }}
  alertsFiring {{ metric subject reason firedAt }}
}}"""

BARE_PAGE = """<!doctype html><html><body><table id="t"></table><script>
(async () => {
  const start = new Date(Date.now() - 7 * 24 * 3600 * 1000).toISOString();
  const answer = await fetch("/graphql", {
    method: "POST",
    headers: {"Content-Type": "application/json",
              "Authorization": "Bearer " + localStorage.getItem("astraeus.token")},
    body: JSON.stringify({query: QUERY, variables: {by: "RUN", start, ws: "default"}}),
  });
  const body = await answer.json();
  const rows = body.data.goodput.rows.map((r) =>
    `<tr data-row="${r.name}"><th>${r.name}</th><td>${r.ledger.allocatedGpuHours.toFixed(1)}</td>` +
    `<td>${r.ledger.productiveGpuHours.toFixed(1)}</td></tr>`);
  document.getElementById("t").innerHTML = rows.join("");
})();
</script></body></html>"""


def load_times(base: str, token: str, trials: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    bare_html = BARE_PAGE.replace("QUERY", repr(QUERY).replace("\\n", " "))
    out: dict[str, list[float]] = {"console": [], "bare": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for _ in range(trials):
                for case, path in (("console", "/o/bench/w/default/goodput"), ("bare", "/bare")):
                    context = browser.new_context(viewport={"width": 1280, "height": 800})
                    context.add_init_script(f"localStorage.setItem('astraeus.token', {token!r})")
                    page = context.new_page()
                    page.route(
                        f"{base}/bare",
                        lambda route: route.fulfill(content_type="text/html", body=bare_html),
                    )
                    page.goto(f"{base}{path}")
                    # Its last row shown (a locator: the console's CSP allows no eval, which
                    # wait_for_function needs).
                    page.locator("tr[data-row]").nth(ROWS - 1).wait_for(timeout=60_000)
                    out[case].append(page.evaluate("performance.now()") / 1000)
                    context.close()
        finally:
            browser.close()
    return out


def bench_page(runs: int, trials: int) -> dict[str, Any]:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    day1 = now - timedelta(days=8)
    with fresh_database() as url:
        data = populate_ledgers(url, runs, 8, day1)
        with serving(url) as (base, token):
            times = load_times(base, token, trials)
    return {
        **data,
        "trials": trials,
        "console_seconds": median(times["console"]),
        "bare_seconds": median(times["bare"]),
        "ratio": median(times["console"]) / median(times["bare"]),
        "all": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    bundle = bench_bundle()
    page = bench_page(args.runs, args.trials)
    save("console", {"bundle": bundle, "page": page})
    c, b = bundle["console"], bundle["bare_react"]
    print(
        f"console bundle: {c['gzip_bytes'] / 1024:.1f} KiB gzipped ({c['bytes'] / 1024:.0f} KiB), "
        f"{c['first_visit_gzip_bytes'] / 1024:.1f} KiB on a first visit (the charts load when "
        f"opened), against bare React {b['gzip_bytes'] / 1024:.1f} KiB: {bundle['ratio']:.2f}x, "
        f"first visit {bundle['first_visit_ratio']:.2f}x"
    )
    print(
        f"goodput page, {page['runs']:,} runs over 7 days ({page['goodput_hours']:,} hourly "
        f"cells), first {ROWS} rows shown: {page['console_seconds'] * 1000:.0f} ms from "
        f"navigation (median of {page['trials']}, a new context each) against a bare page "
        f"with the same query {page['bare_seconds'] * 1000:.0f} ms: {page['ratio']:.2f}x"
    )
    if SERVER_ERRORS:
        print(
            f"server errors while measured: {len(SERVER_ERRORS)} (first: {SERVER_ERRORS[0]}; "
            f"the log: {SERVER_LOG})"
        )


if __name__ == "__main__":
    main()
