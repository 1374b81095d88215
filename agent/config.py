"""What an agent is told when it starts: its server and token, this machine and its GPUs, its
folders, its executor, and what of the machine its workloads may reach (agent/main.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from agent import engine as engines
from agent import sandbox
from agent.gpus import GpuDevice, NvmlSampler
from agent.identity import WorkloadUsers, workload_dir
from agent.transport import Transport

# The machine's own credential, from the join token, in its data folder (0600).
CREDENTIAL_FILE = "machine-credential"
CREDENTIAL_PREFIX = "astm_"  # a machine credential (a join token begins astj_)


@dataclass
class AgentConfig:
    server: str
    token: str
    machine: str
    data_dir: Path
    gpus: list[GpuDevice]
    cpu_cores: float
    memory_bytes: int
    pool: str | None = None
    # Where other machines reach this one (gangs' MASTER_ADDR); empty: the local address of
    # the connection to the server (agent/rendezvous.py).
    advertise_address: str = ""
    heartbeat_seconds: float = 10.0
    sample_seconds: float = 5.0
    prepare_poll_seconds: float = 2.0
    # "docker": containers through the Docker Engine API; "slurm": a Slurm node's agent, which
    # runs no workers and watches those Slurm runs here (agent/slurm_watch.py), reading Slurm
    # with the slurm.conf and the commands' folder given (None: the default, the PATH).
    executor: str = "process"
    slurm_conf: str | None = None
    slurm_bin: str | None = None
    docker_socket: str = engines.SOCKET
    nvml: NvmlSampler | None = None
    # Who workloads run as (agent/identity.py), and what of the machine they may reach:
    # folders drives may be filled from, folders mount paths may be linked in (none: only
    # under the worker's own folder).
    users: WorkloadUsers = field(default_factory=WorkloadUsers)
    fill_roots: tuple[Path, ...] = ()
    mount_roots: tuple[Path, ...] = ()
    # The most processes and threads a worker may have together (pids.max, a container's
    # --pids-limit); 0: no limit (agent/sandbox.py).
    workload_pids_max: int = sandbox.PIDS_MAX
    # TLS to the server, or plaintext on loopback only (agent/transport.py).
    transport: Transport = field(default_factory=Transport)

    @property
    def install(self) -> str:
        """Names this agent's data folder: two agents on one machine share no control group."""
        return hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:12]

    @property
    def workload_dir(self) -> Path:
        """Where the workers' folders and the drives are (agent/identity.py)."""
        return workload_dir(self.data_dir, self.users)

    @property
    def log_root(self) -> Path:
        """The workers' logs (agent/logs.py), the agent's alone."""
        return self.data_dir / "logs"

    @property
    def worker_root(self) -> Path:
        return self.workload_dir / "workers"

    @property
    def drive_root(self) -> Path:
        return self.workload_dir / "drives"

    @property
    def code_root(self) -> Path:
        """Runs' code archives fetched from the server, by digest (agent/code.py), the
        agent's alone."""
        return self.data_dir / "code"

    def kept_credential(self) -> str | None:
        """The machine's own credential: kept in the data folder, or given by hand as the
        token; None before the agent has joined."""
        path = self.data_dir / CREDENTIAL_FILE
        if path.exists():
            return path.read_text().strip()
        return self.token if self.token.startswith(CREDENTIAL_PREFIX) else None
