"""The process executor: each worker a process group of its own on this machine, kept by a shim.

A worker's runtime folder (``<data>/workers/<worker id>/``, the agent's: 0711, its files 0600)
holds what a restarted agent needs to take it back: its start (payload.json), the shim's pid, the
worker's process group, and how it ended. Inside it, ``home/`` is the workload's own (its
user's alone, 0700): its working folder, progress file, secret files and drive links. The log
lives apart (``<data>/logs/<worker id>/``, the agent's) and outlives it. The workload runs as
an unprivileged user (agent/identity.py), in a clean environment, in control groups it cannot
write (agent/cgroups.py), in a sandbox of its own where the machine gives one (agent/sandbox.py):
its /tmp and /var/tmp are ``tmp/`` and ``var-tmp/`` of its runtime folder (its user's alone),
removed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import cgroups, code, network, prepare, sandbox, shim
from agent.identity import (
    Identity,
    WorkloadUsers,
    base_environment,
    local_name,
    workload_dir,
)
from agent.logs import WorkerLog
from agent.start import StartSpec

STOP_GRACE_SECONDS = 10.0
ADOPTED_POLL_SECONDS = 1.0
PAYLOAD = "payload.json"
KEPT_ID = "kept_worker_id"  # in payload.json: the worker's server id, its folder's name is not


def kept_id(folder: Path, payload: dict[str, Any]) -> int | None:
    """The server id of the worker kept in ``folder``: its name (a folder named by the number),
    else what its payload.json says (one named by the worker's opaque id); None: no worker's."""
    if folder.name.isdigit():
        return int(folder.name)
    kept = payload.pop(KEPT_ID, None)
    return kept if isinstance(kept, int) and kept > 0 else None


def keep_start(folder: Path, worker_id: int, spec: StartSpec) -> None:
    """The worker's start in its folder's payload.json (its folder is named by its opaque id:
    the server's id for it goes with it)."""
    kept = {**spec.to_json(), KEPT_ID: worker_id}
    shim.write_atomically(folder / PAYLOAD, json.dumps(kept), private=True)


def kept_start(folder: Path) -> tuple[int, StartSpec] | None:
    """The server id and the start of the worker a previous agent kept in ``folder``; None
    where nothing is left (an unreadable payload.json: the folder goes) or no worker's is (an
    agent's before ids, or a start this agent cannot read: left as it is)."""
    try:
        payload = json.loads((folder / PAYLOAD).read_text())
    except (OSError, ValueError):
        shutil.rmtree(folder, ignore_errors=True)
        return None
    worker_id = kept_id(folder, payload)
    if worker_id is None:
        return None
    try:
        return worker_id, StartSpec.from_json(payload)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


SHIM_PID = "shim.pid"
PROGRESS = "progress"
HOME = "home"
LINKS = "links.json"
SDK = Path(__file__).parent / "sdk"
SDK_MODULE = "astraeus_progress.py"
EndCause = shim.EndCause
Exit = shim.Exit
LOST = EndCause.LOST
OOM_KILLED = EndCause.OOM_KILLED


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def _is_shim(pid: int) -> bool:
    """The process is alive and is a shim (a recycled pid is not)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    zombie = status.rpartition(")")[2].split()[0] == "Z"
    return not zombie and b"agent.shim" in cmdline


@dataclass
class ProcessWorker:
    """One worker: its start (kept as payload.json), its log, and its shim once released.

    Known on the machine by the server's id for it (folders, logs, control groups): two
    workspaces' workers may share a name."""

    worker_id: int
    spec: StartSpec
    log: WorkerLog
    folder: Path
    started: bool = False
    stopping: bool = False
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    cgroup: cgroups.WorkerCgroup | None = None
    shim_process: asyncio.subprocess.Process | None = None
    # Credentials' values, in memory only (never in payload.json); given at start.
    secrets: dict[str, str] = field(default_factory=dict)
    drive_root: Path | None = None
    users: WorkloadUsers = field(default_factory=WorkloadUsers)
    install: str = "default"  # names the agent's data folder: the control groups' root
    fill_roots: tuple[Path, ...] = ()
    mount_roots: tuple[Path, ...] = ()
    # What this machine gives its workers (agent/sandbox.py), and its memory (/dev/shm's size).
    isolation: sandbox.Isolation = field(default_factory=sandbox.Isolation)
    machine_memory: int = 0

    @property
    def attempt(self) -> int:
        return self.spec.attempt

    @property
    def name(self) -> str:
        """The worker's name, for people (log lines of the agent)."""
        return self.spec.worker or str(self.worker_id)

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return self.spec.gpu_ids

    @property
    def memory_limit_bytes(self) -> int | None:
        return self.spec.memory_limit_bytes

    @property
    def home(self) -> Path:
        """The workload's own folder: its user's alone."""
        return self.folder / HOME

    @property
    def progress_file(self) -> Path:
        return self.home / PROGRESS

    @property
    def code_dir(self) -> Path:
        """Its run's code (issue 41), where its command starts."""
        return self.home / code.FOLDER

    @property
    def workspace_gid(self) -> int | None:
        with contextlib.suppress(ValueError):
            return self.users.workspace_gid(self.spec.workspace_id)
        return None

    def keep(self) -> None:
        """Write the start down: a worker at the barrier survives the agent too."""
        self.folder.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.folder.chmod(0o711)  # its user passes through to home/, and sees nothing else
        for stale in (shim.EXIT, shim.WORKER_PID, shim.UNREADABLE, SHIM_PID, LINKS):
            (self.folder / stale).unlink(missing_ok=True)
        for own in (HOME, *sandbox.TMP_FOLDERS, code.FOLDER):  # an earlier attempt's
            shutil.rmtree(self.folder / own, ignore_errors=True)
        keep_start(self.folder, self.worker_id, self.spec)

    @classmethod
    def adopt(cls, folder: Path, log_root: Path) -> ProcessWorker | None:
        """The worker a previous agent left in this folder, or None when nothing is left."""
        kept = kept_start(folder)
        if kept is None:
            return None
        worker_id, start = kept
        worker = cls(worker_id, start, WorkerLog(log_root, str(worker_id)), folder)
        worker.started = (folder / SHIM_PID).exists()
        spec = folder / shim.SPEC
        if spec.exists():
            with contextlib.suppress(OSError, ValueError):
                worker.cgroup = shim.cgroup_of(json.loads(spec.read_text()))
        return worker

    @property
    def secrets_folder(self) -> Path:
        return self.home / "secrets"

    def environment(self, identity: Identity | None, drives: dict[str, str]) -> dict[str, str]:
        """A clean environment: a few basics, the spec's variables, the credentials, the
        drives, then Astraeus' own. Nothing of the agent's."""
        env = base_environment(identity, str(self.home))
        env.update(self.spec.environment)
        credentials = self.spec.credentials
        env.update(
            prepare.credential_variables(credentials, self.secrets, str(self.secrets_folder))
        )
        env.update(drives)
        env.update(self.spec.astraeus_environment)
        env["ASTRAEUS_PROGRESS_FILE"] = str(self.progress_file)
        # `import astraeus_progress` works in the worker; its own PYTHONPATH comes first.
        sdk = str(self.folder / "sdk")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), sdk) if p)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _make_home(self, identity: Identity | None) -> None:
        """The workload's own folder, made anew; and the progress SDK beside it (the agent's
        own copy may be in a folder its user cannot read)."""
        sandboxed = identity is not None and self.isolation.sandboxed
        for own in (HOME, *(sandbox.TMP_FOLDERS if sandboxed else ())):
            (self.folder / own).mkdir(mode=0o700)
            if identity is not None:
                os.chown(self.folder / own, identity.uid, identity.gid)
        sdk = self.folder / "sdk"
        sdk.mkdir(mode=0o755, exist_ok=True)
        sdk.chmod(0o755)
        shutil.copyfile(SDK / SDK_MODULE, sdk / SDK_MODULE)
        (sdk / SDK_MODULE).chmod(0o644)

    def _not_started(self, why: str) -> None:
        shim.record_exit(self.folder, Exit(None, EndCause.NOT_STARTED, detail=why))

    async def start(self) -> None:
        """Start the shim, which starts the command as the workload's user; the log begins
        anew. A worker that cannot start (its user, a mount) ends with the reason."""
        command = list(self.spec.command)
        self.log.begin()
        self.started = True
        try:
            identity = self.users.of_worker(self.spec)
        except (LookupError, ValueError) as error:
            return self._not_started(str(error.args[0]))
        self._make_home(identity)
        owner = (identity.uid, identity.gid) if identity is not None else None
        if self.spec.code:  # unpacked while it prepared (agent/code.py): now its user's
            staged = self.folder / code.FOLDER
            if not staged.is_dir():
                return self._not_started("its code was not unpacked on this machine")
            await asyncio.to_thread(code.hand_over, staged, self.code_dir, owner)
        credentials = self.spec.credentials
        prepare.write_secret_files(credentials, self.secrets, self.secrets_folder, owner=owner)
        exposed = prepare.Exposed()
        if self.drive_root is not None:
            exposed = prepare.expose_drives(
                self.spec,
                self.drive_root,
                home=self.home,
                mount_roots=self.mount_roots,
                gid=self.workspace_gid,
            )
            if exposed.problem is not None:
                return self._not_started(exposed.problem)
            links = {"links": [str(p) for p in exposed.links]}
            links["folders"] = [str(p) for p in exposed.folders]
            shim.write_atomically(self.folder / LINKS, json.dumps(links), private=True)
        if not command:
            return shim.record_exit(self.folder, Exit(127, EndCause.NOT_FOUND))
        self.cgroup = cgroups.create(local_name(self.worker_id, self.spec), self.install)
        group = None
        if self.cgroup is not None:
            self.cgroup.limit_memory(self.spec.memory_limit_bytes)
            self.cgroup.limit_cpu(self.spec.cpu)
            self.cgroup.share_cpu(self.spec.cpu_request)
            if self.isolation.pids_max:
                self.cgroup.limit_pids(self.isolation.pids_max)
            group = {
                "version": self.cgroup.version,
                "memory": str(self.cgroup.memory),
                "cpu": str(self.cgroup.cpu) if self.cgroup.cpu else None,
                "cpu_limit": str(self.cgroup.cpu_limit) if self.cgroup.cpu_limit else None,
                "pids": str(self.cgroup.pids_group) if self.cgroup.pids_group else None,
            }
        spec = {
            "worker": str(self.worker_id),
            "argv": command,
            "env": self.environment(identity, exposed.variables),
            "cwd": self.spec.working_dir or str(self.code_dir if self.spec.code else self.home),
            "log_root": str(self.log.folder.parent),
            "cgroup": group,
            # agent/enter.py: the process joins these groups itself, as root, before its
            # command runs (nothing it forks escapes them), then becomes the workload's user.
            "cgroup_procs": [str(f) for f in self.cgroup.procs_files()] if self.cgroup else [],
            # agent/enter.py binds these read-only in a mount namespace of the worker's own.
            "read_only": [str(folder) for folder in exposed.read_only],
            # agent/enter.py makes its sandbox there too (agent/sandbox.py).
            "sandbox": self._sandbox(identity, exposed) if identity is not None else None,
            "identity": (
                {"uid": identity.uid, "gid": identity.gid, "groups": list(identity.groups)}
                if identity is not None
                else None
            ),
        }
        # The spec holds the credentials' values: readable by the agent's user only.
        shim.write_atomically(self.folder / shim.SPEC, json.dumps(spec), private=True)
        self.shim_process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent.shim",
            str(self.folder),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        shim.write_atomically(self.folder / SHIM_PID, str(self.shim_process.pid))

    def _sandbox(self, identity: Identity, exposed: prepare.Exposed) -> dict[str, Any] | None:
        """What enter.py makes of the worker's sandbox; the folders the workload needs that lie
        under /tmp or /var/tmp (its own, its drives, the machine's mount roots) bound back."""
        keep = [self.folder, *exposed.folders, *self.mount_roots]
        return sandbox.spec(
            self.isolation,
            self.folder,
            shm=sandbox.shm_bytes(self.spec.memory_limit_bytes, self.machine_memory),
            keep=keep,
            links=list(zip(exposed.links, exposed.folders, strict=True)),
        )

    def ended(self) -> Exit | None:
        """How the worker ended, once its shim has written it down."""
        return shim.recorded_exit(self.folder)

    def alive(self) -> bool:
        pid = _read_int(self.folder / SHIM_PID)
        return pid is not None and _is_shim(pid)

    async def wait(self) -> Exit:
        """Wait for the end the shim records.

        A shim this agent started is its child: its exit wakes us, no polling. A shim of an
        earlier agent is not; it is looked at every ``ADOPTED_POLL_SECONDS`` (the cost of
        sampling stays under 1% of a core with 8 workers: bench/agent_cpu.py)."""
        if self.shim_process is not None:
            await self.shim_process.wait()
            return self.ended() or Exit(None, LOST)
        while True:
            ended = self.ended()
            if ended is not None:
                return ended
            if not self.alive():
                return self.ended() or Exit(None, LOST)
            await asyncio.sleep(ADOPTED_POLL_SECONDS)

    def process_group(self) -> int | None:
        return _read_int(self.folder / shim.WORKER_PID)

    async def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after the grace period."""
        self.stopping = True
        group = self.process_group()
        if group is None or self.ended() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.wait(), STOP_GRACE_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
            self._kill_the_rest()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wait(), STOP_GRACE_SECONDS)

    def _kill_the_rest(self) -> None:
        """Processes of the worker that left its process group (setsid, a daemon) are still
        in its control group: they end too."""
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def release(self) -> None:
        """The worker is gone and reported: whatever it left running, its links at mount
        paths, its group and its runtime folder go too."""
        self._kill_the_rest()
        with contextlib.suppress(OSError, ValueError, KeyError):
            made = json.loads((self.folder / LINKS).read_text())
            prepare.remove_links(
                [Path(p) for p in made["links"]], [Path(p) for p in made["folders"]]
            )
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.folder, ignore_errors=True)


def end_left_workers(data_dir: Path) -> None:
    """Kill every worker (and its shim) an agent left running in ``data_dir``: workers outlive
    their agent by design, so taking a machine out of service (or a test) ends them here. The
    network rules of an agent killed before it could delete them go too (agent/network.py)."""
    network.sweep()
    data_dir = workload_dir(data_dir, WorkloadUsers())
    for spec_file in data_dir.glob(f"workers/*/{shim.SPEC}"):
        with contextlib.suppress(OSError, ValueError):
            group = shim.cgroup_of(json.loads(spec_file.read_text()))
            if group is not None:
                group.kill_all()  # what left the process group, too
    for pid_file in data_dir.glob(f"workers/*/{shim.WORKER_PID}"):
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    for pid_file in data_dir.glob(f"workers/*/{SHIM_PID}"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            if _is_shim(pid):
                os.kill(pid, signal.SIGKILL)
