"""What every benchmark shares: a throw-away PostgreSQL database built from the migrations,
timing with repeated trials, and one results table (bench/RESULTS.md)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from backend import migrations

ADMIN_URL = os.environ.get(
    "ASTRAEUS_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
OUT = Path(__file__).resolve().parent / "out"


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new PostgreSQL database with the schema from the migrations; dropped afterwards, unless
    ASTRAEUS_BENCH_KEEP=1 (its name is printed, to look into what a run left)."""
    name = f"astraeus_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    try:
        migrations.upgrade(url)
        yield url
    finally:
        if os.environ.get("ASTRAEUS_BENCH_KEEP") == "1":
            print(f"bench: kept the database {url}", file=sys.stderr)
        else:
            with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def tenancy(conn: psycopg.Connection[Any], at: datetime) -> tuple[int, int, int]:
    """An organisation 'bench' with its cluster 'local' and workspace 'default', created at
    ``at``: (organisation, cluster, workspace) ids."""
    org = conn.execute(
        "INSERT INTO organizations (name, created_at) VALUES ('bench', %s) RETURNING id", (at,)
    ).fetchone()[0]  # type: ignore[index]
    cluster = conn.execute(
        "INSERT INTO clusters (organization_id, name, created_at) VALUES (%s, 'local', %s) "
        "RETURNING id",
        (org, at),
    ).fetchone()[0]  # type: ignore[index]
    ws = conn.execute(
        "INSERT INTO workspaces (organization_id, name, created_at) VALUES (%s, 'default', %s) "
        "RETURNING id",
        (org, at),
    ).fetchone()[0]  # type: ignore[index]
    return org, cluster, ws


def median(xs: list[float]) -> float:
    return statistics.median(xs)


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def save(name: str, result: dict[str, object]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    result = {
        **result,
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    return path
