"""Goodput accounting's two benchmarks (issue 5), each beside a bare baseline measured in the same
run: one tick at 100 000 live workers (bench/goodput_tick.py) and a 7-day report by run over
10 000 runs (bench/goodput_report.py). Figures are reported, never asserted.

    python -m bench.goodput [--only tick|report] [--runs 10000] [--workers-per-run 10]
        [--machines 1000] [--trials 3] [--repeat 7] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench.common import Timer, fresh_database, save
from bench.goodput_report import bench_report, print_report
from bench.goodput_tick import bench_tick, populate_tick, print_tick


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["tick", "report"])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--workers-per-run", type=int, default=10)
    parser.add_argument("--machines", type=int, default=1_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7, help="report: timed repetitions")
    parser.add_argument("--profile", action="store_true", help="cProfile one later tick")
    args = parser.parse_args()
    result: dict[str, Any] = {}
    if args.only in (None, "tick"):
        with fresh_database() as url:
            with Timer() as fill:
                cluster = populate_tick(url, args.runs, args.workers_per_run, args.machines)
            r = asyncio.run(bench_tick(url, args.trials, args.profile))
        result["tick"] = {**cluster, "machines": args.machines, "fill_seconds": fill.seconds, **r}
    if args.only in (None, "report"):
        with fresh_database() as url:
            result["report"] = bench_report(url, args.runs, args.repeat)
    save("goodput" if args.only is None else f"goodput_{args.only}", result)
    if "tick" in result:
        print_tick(result["tick"], result["tick"]["workers"])
        if result["tick"]["profile"]:
            print(result["tick"]["profile"])
    if "report" in result:
        print_report(result["report"])


if __name__ == "__main__":
    main()
