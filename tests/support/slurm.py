"""A real one-node Slurm cluster for the tests (issue 25): Debian's slurm-wlm and slurmdbd with
munge, all state in a folder of its own, ports of its own, accounting in a MariaDB database of
its own. The node declares two GPUs as generic resources (character devices made with mknod:
gres.conf's File= must name devices, or the node is INVAL).

Started with `SlurmCluster.start()`, stopped (and its database dropped) with `stop()`; `run()`
runs a Slurm command against it. Needs root (slurmd runs jobs as their users; the daemons
run as root here) and MariaDB on 127.0.0.1:3306 with root and no password (this machine kind's).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from agent.cgroups import WorkerCgroup
from agent.config import AgentConfig
from agent.connection import Agent
from agent.gpus import simulated
from backend.accounting import counting
from backend.clock import SystemClock
from backend.db import Database
from backend.gateway.servicer import AgentService
from backend.machine_identity import service as identity
from backend.models import GoodputHour, Run, SlurmRun, StateTransition, Worker
from backend.organizations import service as organizations
from backend.slurm import service as importer
from backend.slurm.commands import SlurmSettings
from tests.support import FakeClock, free_port
from tests.support.agents import agent_endpoint
from tests.support.api import CREATE, graphql

DAEMONS = ("munged", "slurmdbd", "slurmctld", "slurmd", "sacctmgr", "sbatch")
MARIADB = ("mariadb", "-h", "127.0.0.1", "-u", "root")
GPUS = 2
COMMAND_TIMEOUT = 30.0


def missing() -> list[str]:
    """What this machine lacks to run the cluster (empty when it can)."""
    lacks = [name for name in DAEMONS if shutil.which(name) is None]
    if shutil.which("mariadb") is None:
        lacks.append("mariadb")
    if os.geteuid() != 0:
        lacks.append("root")
    return lacks


def marks() -> list[pytest.MarkDecorator]:
    """A Slurm test module's marks: a module of real processes (the e2e lane), skipped where
    this machine cannot run Slurm, except under CI (which installs it: .ci/run)."""
    lacks = missing()
    return [
        pytest.mark.e2e,
        pytest.mark.skipif(
            bool(lacks) and os.environ.get("CI") != "true",
            reason=f"needs Slurm here (make slurm): {', '.join(lacks)}",
        ),
    ]


class SlurmCluster:
    """One node (this machine, under its short host name) in partition ``gpu``, with accounts
    the tests add (``account``), accounting in slurmdbd.

    With ``cgroups``, Slurm puts each job's processes in control groups of its own (v1 here:
    proctrack/cgroup, task/cgroup with its memory limit), as production clusters do; the node
    is then named apart (``<host>-<tag>``): slurmd keeps its groups under ``slurm_<node>``, and
    two such clusters of parallel test lanes must not share them (both have a job 1)."""

    def __init__(self, root: Path, *, name: str = "astra", cgroups: bool = False) -> None:
        self.root = root
        self.name = name
        self.cgroups = cgroups
        self.host = socket.gethostname().split(".")[0]  # slurmctld's
        self.node = f"{self.host}-{uuid.uuid4().hex[:6]}" if cgroups else self.host
        self.database = f"slurm_acct_{uuid.uuid4().hex[:10]}"
        self.conf = root / "etc" / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.sock"
        self._daemons: list[subprocess.Popen[bytes]] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm command needs to reach this cluster (and print UTC times)."""
        return {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            "TZ": "UTC",
            "SLURM_TIME_FORMAT": "%Y-%m-%dT%H:%M:%S",
        }

    def run(self, *argv: str, check: bool = True, timeout: float = COMMAND_TIMEOUT) -> str:
        done = subprocess.run(
            argv,
            env=self.env,
            cwd=self.root,  # where a batch job's output goes (slurm-<id>.out)
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    # ---- start and stop ----

    def start(self) -> None:
        for folder in ("etc", "munge", "spool/ctld", "spool/d", "log", "dev", "run"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        self._devices()
        self._munge()
        self._configure()
        subprocess.run([*MARIADB, "-e", f"CREATE DATABASE {self.database}"], check=True, timeout=30)
        self._daemon("slurmdbd", "-D")
        self._wait(lambda: self._answers(("sacctmgr", "-n", "list", "cluster")), "slurmdbd")
        self.run("sacctmgr", "-i", "add", "cluster", self.name)
        self._daemon("slurmctld", "-D", "-i")
        self._wait(lambda: self._answers(("scontrol", "ping")), "slurmctld")
        self._daemon("slurmd", "-D", "-N", self.node)
        self._wait(self._node_idle, "slurmd (the node idle)")

    def stop(self) -> None:
        for process in reversed(self._daemons):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self._daemons):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        self._daemons.clear()
        self._stop_munge()
        if self.cgroups:
            _remove_groups(self.node)
        subprocess.run(
            [*MARIADB, "-e", f"DROP DATABASE IF EXISTS {self.database}"], check=False, timeout=30
        )

    def stop_accounting(self) -> None:
        """slurmdbd stops (slurmctld keeps what it would have sent, and sends it once back)."""
        (dbd,) = [p for p in self._daemons if p.args[0] == "slurmdbd"]  # type: ignore[index]
        dbd.send_signal(signal.SIGTERM)
        dbd.wait(timeout=15)
        self._daemons.remove(dbd)

    def start_accounting(self) -> None:
        self._daemon("slurmdbd", "-D")
        self._wait(lambda: self._answers(("sacctmgr", "-n", "list", "cluster")), "slurmdbd")

    def account(self, name: str, *users: str) -> None:
        """An account, with the users who may charge it (root always)."""
        self.run("sacctmgr", "-i", "add", "account", name, f"cluster={self.name}")
        for user in ("root", *users):
            self.run("sacctmgr", "-i", "add", "user", user, f"account={name}")

    def sbatch(self, *argv: str) -> str:
        """Submit a batch job; its job id."""
        out = self.run("sbatch", "--parsable", *argv)
        return out.strip().split(";")[0]

    def scancel_all(self) -> None:
        self.run("scancel", "--full", "-u", "root", check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not self.run("squeue", "-h", "-o", "%i", check=False).strip():
                return
            time.sleep(0.2)

    # ---- what start() is made of ----

    def _devices(self) -> None:
        for i in range(GPUS):
            device = self.root / "dev" / f"gpu{i}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device

    def _munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        munge = self.root / "munge"
        subprocess.run(
            [
                "munged",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
                "--force",
            ],
            check=True,
            timeout=30,
        )

    def _configure(self) -> None:
        root, sock = self.root, self.munge_socket
        # (ports of this lane's own, below the kernel's range for outgoing connections: one it
        # handed out as free was taken by a connection before slurmd bound it, in the CI)
        ctld, slurmd, dbd = free_port(), free_port(), free_port()
        self.conf.write_text(
            "\n".join(
                [
                    f"ClusterName={self.name}",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={ctld}",
                    f"SlurmdPort={slurmd}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={sock}",
                    f"StateSaveLocation={root / 'spool/ctld'}",
                    f"SlurmdSpoolDir={root / 'spool/d'}",
                    f"SlurmctldPidFile={root / 'run/slurmctld.pid'}",
                    f"SlurmdPidFile={root / 'run/slurmd.pid'}",
                    f"SlurmctldLogFile={root / 'log/slurmctld.log'}",
                    f"SlurmdLogFile={root / 'log/slurmd.log'}",
                    *(
                        ("ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup")
                        if self.cgroups
                        else ("ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none")
                    ),
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core_Memory",
                    "SchedulerType=sched/backfill",
                    "GresTypes=gpu",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    "AccountingStorageHost=127.0.0.1",
                    f"AccountingStoragePort={dbd}",
                    f"AccountingStoragePass={sock}",
                    "AccountingStorageTRES=gres/gpu",
                    "AccountingStorageEnforce=associations",
                    "JobAcctGatherType=jobacct_gather/"
                    + ("cgroup" if self.cgroups else "none"),  # (cgroup: the cpuacct groups)
                    "DefMemPerCPU=100",
                    "MinJobAge=300",
                    "SchedulerParameters=sched_interval=2",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 "
                    f"Gres=gpu:{GPUS} State=UNKNOWN",
                    f"PartitionName=gpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        (root / "etc" / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n"
            "ConstrainRAMSpace=yes\nConstrainCores=no\nConstrainDevices=no\n"
        )
        (root / "etc" / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu File={root / 'dev'}/gpu[0-{GPUS - 1}]\n"
        )
        dbd_conf = root / "etc" / "slurmdbd.conf"
        dbd_conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={sock}",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={dbd}",
                    "SlurmUser=root",
                    f"PidFile={root / 'run/slurmdbd.pid'}",
                    f"LogFile={root / 'log/slurmdbd.log'}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    "StoragePort=3306",
                    "StorageUser=root",
                    f"StorageLoc={self.database}",
                    "",
                ]
            )
        )
        os.chmod(dbd_conf, 0o600)

    def _daemon(self, *argv: str) -> None:
        log = open(self.root / "log" / f"{argv[0]}.out", "ab")  # noqa: SIM115 (kept with it)
        self._daemons.append(
            subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        )
        log.close()

    def _answers(self, argv: Sequence[str]) -> bool:
        try:
            return (
                subprocess.run(
                    argv, env=self.env, capture_output=True, timeout=5, check=False
                ).returncode
                == 0
            )
        except subprocess.TimeoutExpired:
            return False

    def _node_idle(self) -> bool:
        state = self.run("sinfo", "-h", "-n", self.node, "-o", "%T", check=False).strip()
        return state == "idle"

    def _wait(self, ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self._daemons:
                if process.poll() is not None:
                    raise RuntimeError(f"{process.args[0]} exited: see {self.root / 'log'}")
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{what} not ready after {timeout:g}s: see {self.root / 'log'}")

    def _stop_munge(self) -> None:
        pid_file = self.root / "munge" / "munged.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


def _remove_groups(node: str, root: Path = Path("/sys/fs/cgroup")) -> None:
    """The control groups slurmd left for its node, deepest first, and what still ran in them
    (the steps of a job a failed test left running: with slurmd gone, they would wait for
    ever)."""
    for top in root.glob(f"*/slurm_{node}"):
        WorkerCgroup(1, top, None).kill_all()
        for folder in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if folder.is_dir():
                with contextlib.suppress(OSError):
                    folder.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


# ---- fixtures (tests/conftest.py offers them to every test) ----


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node Slurm cluster of the test module's own."""
    found = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    found.start()
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture(scope="module")
def slurm_cgroups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node Slurm cluster of the test module's own that puts jobs in control groups."""
    found = SlurmCluster(tmp_path_factory.mktemp("slurm"), cgroups=True)
    found.start()
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture
def slurm_accounts(slurm: SlurmCluster) -> Iterator[tuple[str, str]]:
    """Two Slurm accounts of this test alone (other tests' jobs are of accounts not mapped);
    every job is cancelled after it."""
    tag = uuid.uuid4().hex[:6]
    names = (f"alpha{tag}", f"beta{tag}")
    for name in names:
        slurm.account(name)
    yield names
    slurm.scancel_all()


# ---- runs submitted to Slurm from Astraeus ----

# The same unmodified DDP script the embedded runs train with (tests/workloads/scripts).
DDP = Path(__file__).parents[1] / "workloads" / "scripts" / "ddp_train.py"


@pytest.fixture
def torch_ok() -> None:
    pytest.importorskip("torch", reason="the [workloads] extra (make test installs it)")


def ddp_spec(name: str, *args: str) -> dict[str, Any]:
    return {
        "name": name,
        "cluster": "hpc",
        "workers": 2,
        "gpus": 1,
        "command": [sys.executable, str(DDP), "--steps", "6", "--sleep", "0.1", *args],
        "environment": {"PYTHONUNBUFFERED": "1"},
    }


async def submit(client: httpx.AsyncClient, token: str, spec: dict[str, Any]) -> dict[str, Any]:
    answer = await graphql(client, token, CREATE, spec=spec)
    created = answer["data"]["createRun"]
    assert not created["errors"], created["errors"]
    return created["run"]  # type: ignore[no-any-return]


async def run_of_name(db: Database, name: str) -> Run:
    async with db.read() as session:
        run = await session.scalar(select(Run).where(Run.name == name))
    assert run is not None
    return run


async def submitted_job(db: Database, clock: FakeClock, cluster_id: int, name: str) -> str:
    clock.moment = datetime.now(UTC)
    result = await importer.import_cluster(db, clock, cluster_id)
    assert result.error is None, result.error
    run = await run_of_name(db, name)
    assert run.external_id is not None, "not submitted"
    kept = await slurm_of(db, run)
    assert kept.job_id == run.external_id and kept.submitted
    assert "slurm" not in run.spec  # the user's specification, as Run again submits it
    return run.external_id


async def slurm_of(db: Database, run: Run) -> SlurmRun:
    """The run's Slurm job as the import keeps it (backend/models/slurm.py)."""
    async with db.read() as session:
        found = await session.get(SlurmRun, run.id)
    assert found is not None, f"run {run.name} has no Slurm job"
    return found


# ---- the agent on the node (astraeus agent --executor slurm) ----


async def node_credential(db: Database, clock: FakeClock, cluster_id: int, node: str) -> str:
    """The node's own machine credential in the Slurm-backed cluster, as its agent joins."""
    async with db.transaction() as session:
        org = await organizations.organization_by_name(session, "default")
        joining = await identity.issue_join_token(
            session, clock, organization_id=org.id, cluster_id=cluster_id
        )
        return (await identity.join(session, clock, joining.secret, node)).secret


def node_agent(cluster: SlurmCluster, address: str, credential: str, data_dir: Path) -> Agent:
    """The real agent of the cluster's node, watching what Slurm runs there; two simulated
    GPUs (as the node's gres), sampling twice a second."""
    return Agent(
        AgentConfig(
            server=address,
            token=credential,
            machine=cluster.node,
            data_dir=data_dir,
            gpus=simulated(GPUS, cluster.node),
            cpu_cores=2,
            memory_bytes=2000 * 2**20,
            heartbeat_seconds=1,
            sample_seconds=0.5,
            executor="slurm",
            slurm_conf=str(cluster.conf),
        )
    )


@contextlib.asynccontextmanager
async def watching_node(
    db: Database, clock: FakeClock, cluster: SlurmCluster, cluster_id: int, data_dir: Path
) -> AsyncIterator[AgentService]:
    """The agents' endpoint (on the system's clock: samples and progress come as they are
    measured) with the node's agent joined to it, until the block ends."""
    credential = await node_credential(db, clock, cluster_id, cluster.node)
    async with agent_endpoint(db, SystemClock()) as (service, address):
        running = asyncio.create_task(
            node_agent(cluster, address, credential, data_dir).run_forever()
        )
        try:
            deadline = time.monotonic() + 30
            while not service.streams.by_machine:
                assert time.monotonic() < deadline, "the node's agent did not join"
                assert not running.done(), running.exception()
                await asyncio.sleep(0.05)
            yield service
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running


# ---- what the Slurm tests read and wait for ----


async def import_until(
    db: Database, clock: FakeClock, cluster_id: int, job: str, state: str, within: float = 90
) -> None:
    """Import every second (as the import actor does, faster) until the job's run is in
    ``state`` (the import reads the live queue: a job that runs for seconds is seen running,
    where accounting's listing lags). Not faster: each import is four Slurm commands, and the
    suite's other lanes share the two cores."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        clock.moment = datetime.now(UTC)
        result = await importer.import_cluster(db, clock, cluster_id)
        assert result.error is None, result.error
        found = await _run_state(db, job)
        if found == state:
            return
        assert asyncio.get_running_loop().time() < deadline, f"job {job} never {state}: {found}"
        await asyncio.sleep(1.0)


async def _run_state(db: Database, job: str) -> str:
    async with db.read() as session:
        found = await session.scalar(select(Run.state).where(Run.external_id == job))
    return found or ""


async def hpc(
    db: Database,
    clock: FakeClock,
    cluster: SlurmCluster,
    mapping: dict[str, str],
    **settings: object,
) -> int:
    """Cluster hpc, backed by the test's Slurm, its accounts mapped as given."""
    options = SlurmSettings(conf=str(cluster.conf), timeout_s=30, **settings)  # type: ignore[arg-type]
    return await slurm_backed(db, clock, "hpc", options, mapping)


async def slurm_backed(
    db: Database,
    clock: FakeClock,
    name: str,
    settings: SlurmSettings,
    mapping: dict[str, str] | None = None,
) -> int:
    """A Slurm-backed cluster of organisation default made now; its id."""
    clock.moment = datetime.now(UTC)
    async with db.transaction() as session:
        org = await organizations.organization_by_name(session, "default")
        created = await importer.create_cluster(session, clock, org.id, name, settings)
        for account, workspace in (mapping or {}).items():
            await importer.map_account(session, clock, org.id, name, account, workspace)
        return created.id


# the states in which a job has ended (sacct's JOB STATE CODES)
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


def sacct(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """The job as accounting lists it (as the import reads it: in the list of the day's jobs,
    which has a job seconds after `sacct -j` has it); empty until then."""
    for line in cluster.run(
        "sacct", "-X", "-P", "-n", "-a", "-o", "JobID,State,Submit,Start,End"
    ).splitlines():
        found, state, submit, start, end = line.split("|")
        if found == job_id:
            return {"state": state.split(" ")[0], "submit": submit, "start": start, "end": end}
    return {"state": ""}


async def wait_for(
    cluster: SlurmCluster, job_id: str, *states: str, within: float = 60
) -> dict[str, str]:
    """The job once accounting lists it in one of `states`; in an ended state, once it also
    has the end's time (slurmdbd may record the state a moment before it: "FAILED" with End
    "Unknown" was seen in the CI, and the import waits for the time too)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = sacct(cluster, job_id)
        if found["state"] in states and (
            found["state"] not in ENDED_STATES or found["end"] not in ("", "Unknown")
        ):
            return found
        await asyncio.sleep(0.3)
    raise AssertionError(f"job {job_id} not {states} after {within}s: {sacct(cluster, job_id)}")


def utc(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)


async def run_of(db: Database, job_id: str) -> Run:
    async with db.read() as session:
        found = await session.scalar(select(Run).where(Run.external_id == job_id))
        assert found is not None, f"job {job_id} was not imported"
        return found


async def workers_of(db: Database, run: Run) -> list[Worker]:
    async with db.read() as session:
        return list(
            await session.scalars(
                select(Worker).where(Worker.run_id == run.id).order_by(Worker.rank)
            )
        )


async def history(db: Database, worker: Worker) -> list[tuple[datetime, str, str | None, int]]:
    async with db.read() as session:
        rows = await session.scalars(
            select(StateTransition)
            .where(StateTransition.worker_id == worker.id)
            .order_by(StateTransition.transition_at, StateTransition.id)
        )
        return [(t.transition_at, t.state, t.phase, t.held_gpus) for t in rows]


async def run_history(db: Database, run: Run) -> list[tuple[datetime, str, str]]:
    """The run's own history (not its workers'), as the API lists it: by time."""
    async with db.read() as session:
        rows = await session.scalars(
            select(StateTransition)
            .where(StateTransition.run_id == run.id, StateTransition.worker_id.is_(None))
            .order_by(StateTransition.transition_at, StateTransition.id)
        )
        return [(t.transition_at, t.state, t.reason) for t in rows]


async def ledger(db: Database, scope: str, scope_id: int) -> dict[tuple[str, bool], float]:
    async with db.read() as session:
        rows = await session.scalars(
            select(GoodputHour).where(GoodputHour.scope == scope, GoodputHour.scope_id == scope_id)
        )
        out: dict[tuple[str, bool], float] = {}
        for r in rows:
            out[(r.category, r.held)] = round(out.get((r.category, r.held), 0) + r.gpu_seconds, 3)
    return {k: v for k, v in out.items() if v}


async def tick_after(db: Database, clock: FakeClock, moment: datetime) -> None:
    clock.moment = moment + timedelta(minutes=2)
    async with db.transaction() as session:
        await counting.tick(session, clock)


async def assert_equals_sacct(db: Database, cluster: SlurmCluster, job_id: str, gpus: int) -> None:
    """The completed job's run as sacct has the job, to the second: created at its submission,
    started and ended at its times, its worker waiting (not held) then held from start to end,
    and the ledger the same seconds (idle: no agent sampled its GPUs), once the tick counted
    past its end (``tick_after``)."""
    found = sacct(cluster, job_id)
    assert found["state"] == "COMPLETED", found
    submit, start, end = utc(found["submit"]), utc(found["start"]), utc(found["end"])
    run = await run_of(db, job_id)
    assert (run.state, run.created_at, run.started_at, run.ended_at) == (
        "Completed",
        submit,
        start,
        end,
    ), f"job {job_id}"
    (worker,) = await workers_of(db, run)
    assert await history(db, worker) == [
        (submit, "Pending", "waiting", 0),
        (start, "Running", "running", gpus),
        (end, "Completed", "ended", 0),
    ], f"job {job_id}"
    waited, ran = (start - submit).total_seconds() * gpus, (end - start).total_seconds() * gpus
    expected = {("idle", True): ran, ("waiting", False): waited}
    assert await ledger(db, "run", run.id) == {k: v for k, v in expected.items() if v}
