"""A real Astraeus server in its own process, as `astraeus up` starts it."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from agent import instance
from agent.executor import end_left_workers
from agent.identity import WorkloadUsers, workload_dir
from backend import migrations
from backend.db import Database
from tests.accounting.seed_week import play_seed_week
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy, free_port, make_tenancy
from tests.support.http import HTTP
from tests.support.sandboxed import workload_uids

ASTRAEUS = str(Path(sys.executable).parent / "astraeus")


def end_agent(data_dir: Path) -> None:
    """End the agent still running on this data folder (`astraeus up`'s outlives a crash of
    `up`) and the workers it left, and remove the folder its workloads had outside it
    (/var/lib/astraeus-agent/<install>, when the data folder was out of their reach:
    agent/identity.py)."""
    instance.end(data_dir)
    end_left_workers(data_dir)
    workloads = workload_dir(data_dir, WorkloadUsers())
    if workloads != data_dir:
        shutil.rmtree(workloads, ignore_errors=True)


# The master port ranges test servers hold: a lock on a file each, in a folder every lane of
# the machine shares.
# in the machine's own /tmp, shared by every lane and test session (never a session's folder)
MASTER_PORT_LOCKS = Path("/tmp/astraeus-test-master-ports")


def master_ports() -> tuple[str, int]:
    """A range of a hundred ports below the ephemeral ones for one test server, and the
    descriptor that holds it (a lock on its file, closed on exec) until it is closed: no other
    test server, of this lane or another, draws it meanwhile. Drawn at random, ranges met:
    a gang's rank 0 found its MASTER_PORT claimed by another lane's gang and its restart failed
    (issue 36, a fresh clone's CI: "MASTER_PORT 25404 is in use on local by another program")."""
    MASTER_PORT_LOCKS.mkdir(exist_ok=True)
    for first in random.sample(range(20000, 29000, 100), 90):
        fd = os.open(MASTER_PORT_LOCKS / f"{first}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return f"{first}-{first + 99}", fd
    raise AssertionError("every master port range is held by a test server of this machine")


class Server:
    """`astraeus up` on a data folder of its own, on a free port."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        *,
        local_agent: bool = True,
        up_args: tuple[str, ...] = (),
        **settings: str,
    ) -> None:
        self.data_dir = data_dir
        self.up_args = up_args
        ports, held = master_ports()
        # held while this server may run (it may be started again after a stop)
        weakref.finalize(self, os.close, held)
        self.env = {
            **os.environ,
            "ASTRAEUS_DATA_DIR": str(data_dir),
            "ASTRAEUS_PORT": str(port),
            "ASTRAEUS_CONSOLE_DIR": str(data_dir / "no-console"),
            "ASTRAEUS_AGENT_PORT": str(free_port()),
            "ASTRAEUS_LOCAL_AGENT": "true" if local_agent else "false",
            # Servers of tests in parallel lanes share this host: their gangs' rank 0 would
            # find one another's MASTER_PORT taken (issue 20). A hundred ports of their own.
            "ASTRAEUS_MASTER_PORTS": ports,
            # Its local agent's workload user ids: its own, as every test agent's (issue 37 N9:
            # an agent whose range another live agent holds is refused).
            "ASTRAEUS_AGENT_WORKLOAD_UIDS": workload_uids(self),
            **{f"ASTRAEUS_{k.upper()}": v for k, v in settings.items()},
        }
        self.env.pop("ASTRAEUS_DATABASE_URL", None)
        self.url = f"http://127.0.0.1:{port}"
        self.log = data_dir.parent / "up.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        self.process = subprocess.Popen(
            [ASTRAEUS, "up", *self.up_args],
            env=self.env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if HTTP.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self.log.read_text()
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, self.log.read_text()
            time.sleep(0.2)
        raise AssertionError(f"astraeus up did not answer:\n{self.log.read_text()}")

    @property
    def admin_token(self) -> str:
        """The first admin token: `astraeus up` keeps it in its file, never in its log."""
        return (self.data_dir / "admin-token").read_text().strip()

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [ASTRAEUS, *args], env=self.env, capture_output=True, text=True, check=True
        )
        return done.stdout

    @property
    def agent_port(self) -> str:
        return self.env["ASTRAEUS_AGENT_PORT"]

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        end_agent(self.data_dir / "agent")

    def env_for(self, token: str) -> dict[str, str]:
        return {**os.environ, "API": f"{self.url}/v1", "ASTRA_TOKEN": token}


@contextlib.contextmanager
def running(data_dir: Path, **options: Any) -> Iterator[tuple[Server, str]]:
    """`astraeus up` on a free port, and the token it printed, until the block ends."""
    with serving(data_dir, **options) as (server, _):
        yield server, server.admin_token


@contextlib.contextmanager
def serving_seed_week(data_dir: Path, **options: Any) -> Iterator[tuple[Server, Tenancy]]:
    """The seed week's two runs (tests/accounting/seed_week.py) played two hours ago into an
    embedded server's database, then `astraeus up` on it without its jobs, so nothing more is
    counted while a test reads; the tokens of the tenancy the runs belong to."""
    data_dir.mkdir(parents=True)
    url = f"sqlite:///{data_dir / 'astraeus.db'}"
    migrations.upgrade(url)

    async def play() -> Tenancy:
        db = Database.from_url(url)
        try:
            start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=2)
            clock = FakeClock(start)
            tenancy = await make_tenancy(db, clock)
            await play_seed_week(World(db, clock, tenancy))
            return tenancy
        finally:
            await db.dispose()

    tenancy = asyncio.run(play())
    with serving(data_dir, local_agent=False, run_jobs="false", **options) as (server, _):
        yield server, tenancy


@contextlib.contextmanager
def serving(data_dir: Path, **options: Any) -> Iterator[tuple[Server, str]]:
    """`astraeus up` on a free port (on a data folder that may be set up already), and what it
    printed, until the block ends."""
    server = Server(data_dir, free_port(), **options)
    try:
        yield server, server.start()
    finally:
        server.stop()


class Api:
    """A user's calls to a live server, with a token: GraphQL and the REST shim."""

    def __init__(self, server: Server, token: str) -> None:
        self.server, self.url, self.token = server, server.url, token
        self.headers = {"Authorization": f"Bearer {token}"}

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        answer = HTTP.post(
            f"{self.url}/graphql",
            headers=self.headers,
            json={"query": query, "variables": variables},
            timeout=20,
        ).json()
        assert "errors" not in answer, answer
        return dict(answer["data"])

    def get(self, path: str) -> Any:
        return HTTP.get(f"{self.url}/v1{path}", headers=self.headers, timeout=20).json()


class AgentProcess:
    """`astraeus agent` joining a live server as a machine of the cluster "local"."""

    def __init__(
        self,
        server: Server,
        name: str,
        data_dir: Path,
        *,
        gpus: int = 8,
        model: str = "",
        extra: Sequence[str] = (),
    ) -> None:
        self.server = server
        self.data_dir = data_dir
        token = data_dir.parent / f"{name}.token"
        if not token.exists():
            token.write_text(server.cli("token", "create", "--agent", "--name", name))
        self.command = [
            ASTRAEUS,
            "agent",
            "--server",
            f"127.0.0.1:{server.agent_port}",
            "--token-file",
            str(token),
            "--name",
            name,
            "--data-dir",
            str(data_dir),
            "--simulate-gpus",
            str(gpus),
            *(["--simulate-model", model] if model else []),
            "--heartbeat",
            "1",
            "--sample",
            "1",
            *([] if "--workload-uids" in extra else ["--workload-uids", workload_uids(self)]),
            *extra,
        ]
        self.log = data_dir.parent / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.command,
            env=self.server.env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        """SIGKILL: the agent ends with nothing written; its workers go on without it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def end(self) -> None:
        self.kill()
        end_agent(self.data_dir)
