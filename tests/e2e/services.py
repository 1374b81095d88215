"""PostgreSQL and Redis servers of a test's own, so that a fault test can kill and restart them
without touching the machine's shared services (which the rest of the suite is using).

They are the same server programs the machine runs, started on free loopback ports from
folders of their own: PostgreSQL with ``initdb``/``pg_ctl`` (as the ``postgres`` user when
the tests run as root, since PostgreSQL refuses root), Redis with ``redis-server``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import redis

from tests.e2e.live import free_port


def postgres_bin() -> Path | None:
    """The folder of the PostgreSQL server programs, newest version first (Debian keeps them
    out of PATH, under /usr/lib/postgresql/<version>/bin)."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    return Path(versions[-1]).parent if versions else None


MISSING = (
    "PostgreSQL's server programs (initdb, pg_ctl) and redis-server are needed"
    if postgres_bin() is None or shutil.which("redis-server") is None
    else ""
)


class PrivatePostgres:
    """A PostgreSQL cluster in a folder of its own; ``crash`` stops it as a power cut would
    (``pg_ctl stop -m immediate``: no checkpoint, WAL recovery on the next start)."""

    def __init__(self) -> None:
        bin_dir = postgres_bin()
        assert bin_dir is not None, MISSING
        self.bin = bin_dir
        # not under pytest's tmp folder: that is private to root, and the server runs as postgres
        self.root = Path(tempfile.mkdtemp(prefix="astraeus-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/astraeus"
        self._as_server_user("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-N")

    def _as_server_user(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True)

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        self._as_server_user(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
            "-o", options, "-w", "start",
        )  # fmt: skip

    def create_database(self) -> None:
        admin = self.url.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE astraeus")

    def crash(self) -> None:
        self._as_server_user("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._as_server_user("pg_ctl", "-D", str(self.data), "-m", "fast", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A redis-server that keeps nothing on disk, as the machine's: ``kill`` loses every
    message queued in it, as a Redis that dies does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.root / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.root),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server never answered"
                assert self.process.poll() is None, (self.root / "redis.log").read_text()
                time.sleep(0.1)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
