"""`make bench`: every benchmark, one after the other, each printing its figures beside its bare
baseline; then bench/RESULTS.md: the machine, and what each printed, in one table.

    python -m bench.run_all                 # all of them
    python -m bench.run_all --only console  # some (repeatable); RESULTS.md keeps the others'
    python -m bench.run_all --scale 1m      # all of them, and the million-worker rows
    python -m bench.run_all --only goodput_1m

The million-worker rows (``--scale 1m``: the goodput tick at 1 000 000 workers, issue 24) take
several minutes to fill, so `make bench` runs them only when asked (``BENCH_ARGS="--scale
1m"``); each is a row of its own, and a row not run keeps what RESULTS.md had.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench.common import ADMIN_URL, OUT

BENCHES = (
    "scheduling_pass",
    "metrics_ingest",
    "log_tail",
    "log_follow",
    "agent_cpu",
    "goodput",
    "console",
    "slurm_import",
)
# Rows run only when asked, by scale: each name, and the module and arguments that print it.
SCALED = {"1m": {"goodput_1m": ["bench.goodput", "--scale", "1m"]}}
COMMANDS = {name: [f"bench.{name}"] for name in BENCHES} | {
    name: command for rows in SCALED.values() for name, command in rows.items()
}
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
# What follows the first of these headings is written by hand and kept as it is when the table
# is written again: why a figure misses its target (with its profile), and `make fleet` and
# `make load` (long runs on a whole topology).
HAND_WRITTEN = ("\n## Where a target is not met", "\n## Under load")


def machine() -> list[tuple[str, str]]:
    """What the figures were measured on."""
    cpu = "?"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        cpu = found.group(1).strip() if found else cpu
    memory = "?"
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        found = re.search(r"MemTotal:\s+(\d+) kB", meminfo.read_text())
        memory = f"{int(found.group(1)) / 2**20:.0f} GiB" if found else memory
    try:
        with psycopg.connect(ADMIN_URL) as conn:
            postgres = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    except psycopg.Error as exc:
        postgres = f"not reachable ({exc.__class__.__name__})"

    def version(*command: str) -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return "not installed"
        return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else "?"

    return [
        ("CPU", f"{cpu}, {os.cpu_count()} cores"),
        ("memory", memory),
        ("system", f"{platform.system()} {platform.release()} ({platform.machine()})"),
        ("Python", platform.python_version()),
        ("PostgreSQL", postgres),
        ("Node.js", version("node", "--version")),
        ("Chromium", version("chromium", "--version")),
    ]


def run(name: str) -> dict[str, object]:
    """One benchmark in its own process, its output shown as it comes and kept."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", *COMMANDS[name]],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        sys.stdout.write(line)
        lines.append(line.rstrip("\n"))
    code = process.wait()
    return {
        "name": name,
        "seconds": time.monotonic() - started,
        "exit_code": code,
        # its figures: the lines it printed last (build tools' chatter before them is left out)
        "printed": [line for line in lines if line.strip()][-40:],
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def written_rows() -> dict[str, str]:
    """The rows RESULTS.md has now, by benchmark (a fresh checkout has no run_all.json)."""
    if not RESULTS.exists():
        return {}
    rows = [line for line in RESULTS.read_text().splitlines() if line.startswith("| ")]
    return {row.split(" | ", 1)[0][2:]: row for row in rows}


def write(results: dict[str, dict[str, object]]) -> str:
    rows = ["| benchmark | measured | took | what it printed |", "|---|---|---|---|"]
    earlier = written_rows()
    scaled = [name for rows_ in SCALED.values() for name in rows_]
    for name in [*BENCHES, *scaled]:
        r = results.get(name)
        if r is None and name in scaled:  # asked for only now and then: kept if written once
            rows += [earlier[name]] if name in earlier else []
            continue
        if r is None:
            rows.append(earlier.get(name, f"| {name} | not run | | |"))
            continue
        printed = "<br>".join(
            str(line).replace("|", "\\|")
            for line in r["printed"]  # type: ignore[attr-defined]
        )
        status = "" if r["exit_code"] == 0 else f" (exit code {r['exit_code']})"
        rows.append(f"| {name} | {r['when']}{status} | {r['seconds']:.0f} s | {printed} |")
    described = "\n".join(f"| {k} | {v} |" for k, v in machine())
    text = (
        "# Benchmark results\n\n"
        "Written by `make bench` (bench/run_all.py). Every figure stands beside a bare baseline "
        "measured in the same run on the same machine; read the ratios, not the times.\n\n"
        "| machine | |\n|---|---|\n" + described + "\n\n" + "\n".join(rows) + "\n"
    )
    kept = RESULTS.read_text() if RESULTS.exists() else ""
    starts = [kept.index(heading) for heading in HAND_WRITTEN if heading in kept]
    if starts:
        text += kept[min(starts) :]
    RESULTS.write_text(text)
    (OUT / "run_all.json").write_text(json.dumps(results, indent=2))
    return text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", choices=list(COMMANDS))
    parser.add_argument("--scale", choices=sorted(SCALED), help="also the rows of this scale")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    kept = OUT / "run_all.json"
    results: dict[str, dict[str, object]] = json.loads(kept.read_text()) if kept.exists() else {}
    names = args.only or [*BENCHES, *(SCALED[args.scale] if args.scale else [])]
    for name in names:
        results[name] = run(name)
    print()
    print(write(results))
    failed = [n for n, r in results.items() if r["exit_code"] != 0]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
