"""The Slurm import of a busy site's day (issue 38), beside the bare cost of reading what Slurm
printed, measured in the same run (figures reported, never asserted).

    python -m bench.slurm_import [--jobs 100000] [--nodes 64] [--databases sqlite postgresql]
        [--profile]

`make bench` runs it on SQLite (about 15 minutes at 100 000 jobs); on PostgreSQL the first
import of the day takes over half an hour (bench/RESULTS.md says why), so it runs there only
when asked, best with fewer jobs (``--databases postgresql --jobs 10000``). Each step's figures
are saved as measured (bench/out/slurm_import_<database>_so_far.json).

The day (bench/slurm_day.py): 100 000 jobs, arrays of 5 000, 3 000, 2 000 and 1 000 tasks
among them, as Slurm 22.05's `sacct --json`, `sacct -P`, `squeue --json` and `sinfo --json`
print them, behind fake commands in a folder (``SlurmSettings.bin``) that `cat` the files. The
cluster is made and its accounts mapped by the product's own functions (bootstrap, a second
workspace, ``create_cluster`` reading from the day's start, ``map_account``: alpha and beta
to default, gamma and delta to research, ops left unmapped), then ``import_cluster`` runs:

* the first import: the whole day into a database with nothing of it (its window the day);
* the second, a minute later in Slurm's terms, nothing new: its window the last 11 minutes
  (10 of margin), as the import's next minute reads it;
* the whole day read again (``read_again_from`` the day's start), nothing new in it.

Each beside its bare baseline: the very commands that import ran (logged by the fake
commands), run again the same way (asyncio subprocesses, the same environment) with their
JSON loaded (``json.loads``) and the text of `sacct -P` split in lines; and, for the day,
``json.loads`` alone of the sacct documents already in memory. Peak memory is the process's
resident high-water mark over each step (VmHWM, reset before it). SQLite is the embedded
default (a file, as `astraeus serve` makes it); PostgreSQL a fresh database (bench/common.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import re
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import func, select

from backend import migrations
from backend.db import Database
from backend.models import AgentCommand, Event, Run, StateTransition, Worker
from backend.organizations import service as organizations
from backend.slurm import service as importer
from backend.slurm.commands import SlurmCommands, SlurmSettings
from bench import slurm_day
from bench.common import fresh_database, median, save

T = TypeVar("T")
MAPPING = {"alpha": "default", "beta": "default", "gamma": "research", "delta": "research"}
BASELINE_TRIALS = 3


class FixedClock:
    """The end of the day, all along: every import reads Slurm at the same moment."""

    def now(self) -> datetime:
        return slurm_day.NOW


@dataclass
class Step:
    seconds: float
    peak_rss: int  # bytes


@contextlib.contextmanager
def measured() -> Iterator[dict[str, float]]:
    """Wall seconds and the process's resident high-water mark over the block."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from now on
    out: dict[str, float] = {}
    start = time.perf_counter()
    yield out
    out["seconds"] = time.perf_counter() - start
    status = Path("/proc/self/status").read_text()
    found = re.search(r"VmHWM:\s+(\d+) kB", status)
    out["peak_rss"] = int(found.group(1)) * 1024 if found else 0


# ---- the baselines ----


async def read_bare(calls: list[list[str]]) -> float:
    """The commands run as the import runs them, their output read; seconds."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TZ": "UTC",
        "SLURM_TIME_FORMAT": "%Y-%m-%dT%H:%M:%S",
        "LC_ALL": "C",
    }
    start = time.perf_counter()
    for program, *args in calls:
        process = await asyncio.create_subprocess_exec(
            program,
            *args,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=2**29,
        )
        out, _ = await process.communicate()
        text = out.decode(errors="replace")
        if "--json" in args:
            json.loads(text)
        else:
            [line.split("|") for line in text.splitlines()]
    return time.perf_counter() - start


def loads_bare(documents: list[bytes]) -> float:
    start = time.perf_counter()
    for document in documents:
        json.loads(document)
    return time.perf_counter() - start


def baseline(calls: list[list[str]]) -> tuple[float, int]:
    """The median of a few runs of the bare commands (their output dropped between runs), and
    the peak resident memory over them."""
    seconds, peak = [], 0
    for _ in range(BASELINE_TRIALS):
        with measured() as m:
            seconds.append(asyncio.run(read_bare(calls)))
        peak = max(peak, int(m["peak_rss"]))
    return median(seconds), peak


def sacct_documents(day: slurm_day.Day, calls: list[list[str]]) -> list[bytes]:
    """The sacct --json documents these calls printed (the files the fake sacct cat)."""
    out = []
    for program, *args in calls:
        if Path(program).name == "sacct" and "--json" in args:
            window = "recent"
            if f"--starttime={slurm_day.DAY_START:%Y-%m-%dT%H:%M:%S}" in args:
                window = "day"
            suffix = "_ca" if "--state=CANCELLED" in args else ""
            out.append((day.folder / f"sacct_{window}{suffix}.json").read_bytes())
    return out


# ---- the import ----


@contextlib.asynccontextmanager
async def database(dialect: str, folder: Path) -> AsyncIterator[Database]:
    """A database with the schema from the migrations: a SQLite file (the embedded default)
    or a fresh PostgreSQL database."""
    with contextlib.ExitStack() as stack:
        if dialect == "sqlite":
            url = f"sqlite:///{folder / 'astraeus.db'}"
            migrations.upgrade(url)
        else:
            url = stack.enter_context(fresh_database())
        db = Database.from_url(url, pool_size=2)
        try:
            yield db
        finally:
            await db.dispose()


async def site(db: Database, clock: FixedClock, bin_: Path) -> tuple[int, int]:
    """The organisation, cluster site reading the day's Slurm from its start, the accounts
    mapped: (organisation id, cluster id)."""
    async with db.transaction() as session:
        await organizations.bootstrap(session, clock)
        org = await organizations.organization_by_name(session, "default")
        await organizations.create_workspace(
            session, clock, organization_id=org.id, name="research"
        )
        settings = SlurmSettings(bin=str(bin_), timeout_s=600)
        cluster = await importer.create_cluster(
            session, clock, org.id, "site", settings, since=slurm_day.DAY_START
        )
        for account, workspace in MAPPING.items():
            await importer.map_account(session, clock, org.id, "site", account, workspace)
        return org.id, cluster.id


async def rows(db: Database) -> dict[str, int]:
    async with db.read() as session:
        counted = {}
        for model in (Run, Worker, StateTransition, Event, AgentCommand):
            found = await session.scalar(select(func.count()).select_from(model))
            counted[str(model.__tablename__)] = int(found or 0)
        return counted


async def timed(work: Callable[[], Awaitable[T]]) -> tuple[T, dict[str, float]]:
    with measured() as m:
        result = await work()
    return result, m


async def bench_import(
    dialect: str, day: slurm_day.Day, folder: Path, profile: bool
) -> dict[str, Any]:
    clock = FixedClock()
    out: dict[str, Any] = {"dialect": dialect}
    async with database(dialect, folder) as db:
        org, cluster = await site(db, clock, day.bin)
        day.calls()

        def once() -> Awaitable[importer.ImportResult]:
            return importer.import_cluster(db, clock, cluster)

        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        first, out["first"] = await timed(once)
        if profiler:
            profiler.disable()
            out["profile"] = _top(profiler)
        out["first"]["calls"] = day.calls()
        out["first"]["result"] = _result(first)
        out["rows"] = await rows(db)
        save(f"slurm_import_{dialect}_so_far", out)
        second, out["second"] = await timed(once)
        out["second"]["calls"] = day.calls()
        out["second"]["result"] = _result(second)
        save(f"slurm_import_{dialect}_so_far", out)

        async with db.transaction() as session:
            await importer.read_again_from(session, org, "site", slurm_day.DAY_START)
        again, out["again"] = await timed(once)
        out["again"]["calls"] = day.calls()
        out["again"]["result"] = _result(again)
        out["rows_after"] = await rows(db)
        save(f"slurm_import_{dialect}_so_far", out)

        # where the first import's time goes: Slurm read, parsed and merged (no database)
        commands = SlurmCommands(SlurmSettings(bin=str(day.bin), timeout_s=600))
        _, out["read_only"] = await timed(
            lambda: importer.read(commands, slurm_day.DAY_START, slurm_day.NOW)
        )
        day.calls()
    return out


def _result(r: importer.ImportResult) -> dict[str, Any]:
    return {
        "jobs": r.jobs,
        "created": r.created,
        "changed": r.changed,
        "unmapped": r.unmapped,
        "error": r.error,
        "quarantined": len(r.quarantined),
    }


def _top(profiler: cProfile.Profile, lines: int = 30) -> str:
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(lines)
    return "\n".join(line for line in text.getvalue().splitlines() if line.strip())


# ---- the report ----


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def report(day: slurm_day.Day, bare: dict[str, Any], imports: list[dict[str, Any]]) -> None:
    arrays = sum(v for k, v in day.states.items() if "array task" in k)
    sacct = day.sizes["sacct_day.json"] + day.sizes["sacct_day_ca.json"]
    print(
        f"slurm import, a day of {day.jobs:,} jobs ({arrays:,} of them array tasks, "
        f"{day.records:,} sacct records: {mb(sacct)} of sacct --json, "
        f"{mb(day.sizes['squeue.json'])} of squeue --json) over {bare['nodes']} nodes of 8 GPUs"
    )
    print(
        f"  bare, the day: the import's {bare['day_calls']} commands through the same fake "
        f"binaries, output read and JSON loaded {bare['day']:.2f} s (peak RSS "
        f"{mb(bare['day_peak_rss'])}); json.loads of the sacct documents alone "
        f"{bare['loads']:.2f} s"
    )
    print(
        f"  bare, the last 11 minutes (the next import's window): {bare['recent']:.3f} s "
        "(the same commands and reading)"
    )
    header = (
        f"  {'database':<10} {'step':<34} {'s':>8} {'x bare':>7} {'x loads':>8} {'peak RSS':>10}"
    )
    print(header)
    for r in imports:
        steps = (
            ("first import (the day)", r["first"], bare["day"], bare["loads"]),
            ("second import (nothing new)", r["second"], bare["recent"], None),
            ("the day read again (nothing new)", r["again"], bare["day"], bare["loads"]),
            ("  of the first: read, parse, merge", r["read_only"], bare["day"], bare["loads"]),
        )
        for name, m, against, loads in steps:
            ratio = f"{m['seconds'] / against:.1f}x"
            versus = f"{m['seconds'] / loads:.1f}x" if loads else ""
            print(
                f"  {r['dialect']:<10} {name:<34} {m['seconds']:>8.2f} {ratio:>7} {versus:>8} "
                f"{mb(m['peak_rss']):>10}"
            )
        first, rows_ = r["first"]["result"], r["rows"]
        print(
            f"  {r['dialect']:<10} first import: {first['created']:,} runs made of "
            f"{first['jobs']:,} mapped jobs ({sum(first['unmapped'].values()):,} of account "
            f"ops unmapped); {rows_['workers']:,} workers, {rows_['state_transitions']:,} "
            f"transitions, {rows_['events']:,} events, {rows_['agent_commands']:,} watches; "
            f"second: {r['second']['result']['created']} new, "
            f"{r['second']['result']['changed']} changed; again: "
            f"{r['again']['result']['created']} new, {r['again']['result']['changed']} changed"
        )
        if "profile" in r:
            print(r["profile"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument(
        "--databases",
        nargs="+",
        choices=["sqlite", "postgresql"],
        default=["sqlite"],
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the first import")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slurm-day-") as root:
        folder = Path(root)
        started = time.perf_counter()
        day = slurm_day.write(folder / "day", args.jobs, args.nodes)
        made = time.perf_counter() - started
        imports = []
        for dialect in args.databases:
            (folder / dialect).mkdir()
            imports.append(asyncio.run(bench_import(dialect, day, folder / dialect, args.profile)))
        first_calls = imports[0]["first"]["calls"]
        second_calls = imports[0]["second"]["calls"]
        documents = sacct_documents(day, first_calls)
        day_s, day_rss = baseline(first_calls)
        recent_s, recent_rss = baseline(second_calls)
        bare = {
            "nodes": args.nodes,
            "day_calls": len(first_calls),
            "day": day_s,
            "day_peak_rss": day_rss,
            "recent": recent_s,
            "recent_peak_rss": recent_rss,
            "loads": median([loads_bare(documents) for _ in range(BASELINE_TRIALS)]),
        }
    report(day, bare, imports)
    print(f"  (the day's documents written in {made:.0f} s; not counted)")
    save(
        "slurm_import",
        {
            "jobs": day.jobs,
            "records": day.records,
            "states": day.states,
            "sizes": day.sizes,
            "bare": bare,
            "imports": imports,
        },
    )


if __name__ == "__main__":
    main()
