"""Goodput accounting's two benchmarks (issue 5), each beside a bare baseline measured in the same
run: one tick at 100 000 live workers (bench/goodput_tick.py) and a 7-day report by run over
10 000 runs (bench/goodput_report.py). Figures are reported, never asserted.

    python -m bench.goodput [--only tick|report] [--runs 10000] [--workers-per-run 10]
        [--machines 1000] [--trials 3] [--repeat 7] [--profile]
    python -m bench.goodput --scale 1m  # the tick alone at 1 000 000 workers (issue 24)

``--scale 1m`` is ``--only tick --runs 100000 --workers-per-run 10 --machines 10000 --trials 1``
(filling takes a few minutes); its figures go to bench/out/goodput_1m.json. ASTRAEUS_BENCH_KEEP=1
keeps the filled database to look into it afterwards (bench/common.py).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench.common import Timer, fresh_database, save
from bench.goodput_report import bench_report, print_report
from bench.goodput_tick import bench_tick, populate_tick, print_tick

# The million-worker tick of issue 24: 100 000 runs of 10 workers on 10 000 machines, once.
SCALES = {"1m": {"only": "tick", "runs": 100_000, "workers_per_run": 10, "machines": 10_000}}
# What the tick's ratio to the bare statement is asked to stay under, by scale.
TARGETS = {None: "tick <= 2x the bare statement", "1m": "tick <= 1.3x the bare statement, < 30 s"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["tick", "report"])
    parser.add_argument("--scale", choices=sorted(SCALES), help="a preset size (the tick only)")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--workers-per-run", type=int, default=10)
    parser.add_argument("--machines", type=int, default=1_000)
    parser.add_argument("--trials", type=int, default=None, help="default 3 (--scale 1m: 1)")
    parser.add_argument("--repeat", type=int, default=7, help="report: timed repetitions")
    parser.add_argument("--profile", action="store_true", help="cProfile one later tick")
    args = parser.parse_args()
    if args.scale is not None:
        for name, value in SCALES[args.scale].items():
            setattr(args, name, value)
    trials = args.trials if args.trials is not None else 1 if args.scale else 3
    result: dict[str, Any] = {}
    if args.only in (None, "tick"):
        with fresh_database() as url:
            with Timer() as fill:
                cluster = populate_tick(url, args.runs, args.workers_per_run, args.machines)
            r = asyncio.run(bench_tick(url, trials, args.profile))
        result["tick"] = {**cluster, "machines": args.machines, "fill_seconds": fill.seconds, **r}
    if args.only in (None, "report"):
        with fresh_database() as url:
            result["report"] = bench_report(url, args.runs, args.repeat)
    name = f"goodput_{args.scale}" if args.scale else "goodput"
    save(name if args.only is None or args.scale else f"goodput_{args.only}", result)
    if "tick" in result:
        print_tick(result["tick"], result["tick"]["workers"], TARGETS[args.scale])
        if result["tick"]["profile"]:
            print(result["tick"]["profile"])
    if "report" in result:
        print_report(result["report"])


if __name__ == "__main__":
    main()
