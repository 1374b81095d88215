"""``astraeus up``'s local agent: the embedded cluster's one machine (this one), joined with a
join token of the local cluster, and started again whenever it exits while the server serves.

A clean stop of ``up`` (Ctrl-C, SIGTERM) stops its agent: whoever stops ``up`` expects
everything it started to stop. A crash of ``up`` (kill -9, the terminal closed) does not: the
agent, in a session of its own and asking for no signal when its parent dies, keeps measuring
the workers, which run on anyway, and keeps what it measured on disk until a server takes it
(agent/outbox.py). The next ``up`` on the data folder ends that agent, found by the lock it
holds on its data folder (agent/instance.py), and starts its own, which sends what the first
measured: the minutes ``up`` was away are counted as the workers spent them (issue 36).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncSession

from agent.backoff import Backoff
from backend.cli.transaction import in_transaction
from backend.clock import SystemClock
from backend.config import Settings
from backend.errors import AstraeusError
from backend.machine_identity import service as identity
from backend.organizations import service as organizations

# The embedded machine's pool: every machine is in one, or the pool ledgers (`goodput --by
# pool`, the pool's goodput_drop alert) would leave its time out.
LOCAL_POOL = "local"


def local_agent_dir(settings: Settings) -> Path:
    """The local agent's data folder, in the server's."""
    return settings.data_dir / "agent"


def local_agent_command(settings: Settings) -> list[str] | None:
    """The embedded mode's machine: this one, joined with a machine token of the cluster."""
    if settings.agent_client_ca is not None:
        print(
            "  local agent: not started: ASTRAEUS_AGENT_CLIENT_CA asks agents for a client "
            "certificate; start `astraeus agent --client-cert … --client-key …` on this machine",
            flush=True,
        )
        return None
    from agent.config import CREDENTIAL_FILE

    # The local machine joins once with a join token; its agent keeps its own credential.
    token = settings.data_dir / "agent-token"
    if not (local_agent_dir(settings) / CREDENTIAL_FILE).exists():
        old = token.read_text().strip() if token.exists() else None

        async def work(session: AsyncSession) -> str:
            org = await organizations.organization_by_name(session, "default")
            cluster = await organizations.cluster_by_name(session, org.id, "local")
            issued = await identity.rejoin_token(session, SystemClock(), cluster, "local", old)
            return issued.secret

        try:
            secret = in_transaction(settings, work)
        except AstraeusError:
            return None  # set up by hand (another organisation or cluster): no local agent
        token.unlink(missing_ok=True)
        token.touch(mode=0o600)
        token.write_text(secret + "\n")
    command = [
        sys.executable,
        "-m",
        "backend.cli.server",
        "agent",
        "--server",
        f"127.0.0.1:{settings.agent_port}",
        "--token-file",
        str(token),
        "--name",
        "local",
        # Gangs' MASTER_ADDR: the embedded cluster's one machine reaches itself on loopback.
        "--advertise-address",
        "127.0.0.1",
        "--pool",
        LOCAL_POOL,
        "--data-dir",
        str(local_agent_dir(settings)),
        "--simulate-gpus",
        str(settings.local_agent_gpus),
        *_local_agent_tls(settings),
    ]
    print(
        f"  local agent: machine 'local' in pool '{LOCAL_POOL}', up to "
        f"{settings.local_agent_gpus} simulated GPUs "
        "without NVIDIA ones",
        flush=True,
    )
    return command


def _local_agent_tls(settings: Settings) -> list[str]:
    """With a certificate, the local agent verifies it: with its CA (ASTRAEUS_TLS_CA), else the
    certificate itself (a self-signed one), as the name of the public URL when there is one."""
    if settings.tls_cert is None:
        return []
    flags = ["--ca-file", str(settings.tls_ca or settings.tls_cert)]
    public_host = urlsplit(settings.public_url).hostname if settings.public_url else None
    return [*flags, "--tls-server-name", public_host] if public_host else flags


# Starting the local agent again after it exits: 1 s, doubling up to 30 s; an agent that stayed
# up 60 s starts the wait over at 1 s.
RESTART_DELAY_FIRST = 1.0
RESTART_DELAY_MAX = 30.0
RESTART_DELAY_RESET_AFTER = 60.0


def restart_backoff() -> Backoff:
    """The waits before starting the local agent again (``wait(seconds it stayed up)``)."""
    return Backoff(RESTART_DELAY_FIRST, RESTART_DELAY_MAX, reset_after=RESTART_DELAY_RESET_AFTER)


class LocalAgent:
    """`astraeus up`'s local agent, started again whenever it exits while the server serves, so
    that the machine is not lost while the server is fine (issue 17). Its workers outlive it: the
    agent started again takes them back from its data folder.

    One thread starts each agent process and waits for it. The agent runs in a session of its
    own (``start_new_session``: no ``preexec_fn``, whose Python between fork and exec the
    server's threads, gRPC's among them, make unsafe), so that neither the terminal's signals
    nor the end of `up` reach it: only ``stop`` ends it."""

    def __init__(self, command: list[str], data_dir: Path, *, serving: Callable[[], bool]) -> None:
        self.command = command
        self.data_dir = data_dir  # the agent's, whose lock names the agent running on it
        self.serving = serving
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # no agent starts once `stop` has begun
        self._thread = threading.Thread(target=self._supervise, name="local-agent", daemon=True)

    def start(self) -> None:
        """End the agent an earlier `up` left running (it crashed), then start this one's."""
        from agent import instance

        ended = instance.end(self.data_dir)
        if ended is not None:
            print(
                f"  local agent: the one an earlier astraeus up left running (pid {ended}) "
                "ended; what it measured is sent by this one",
                flush=True,
            )
        self._thread.start()

    def stop(self, timeout: float = 15) -> None:
        """No more starts first, then the agent ends as `up` ends it: SIGTERM, then SIGKILL after
        ``timeout`` seconds."""
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._thread.join(timeout=timeout)

    def _ending(self) -> bool:
        return self._stopping.is_set() or not self.serving()

    def _supervise(self) -> None:
        restarts = restart_backoff()
        while True:
            started = time.monotonic()
            outcome = self._run_agent()
            if outcome is None or self._ending():
                return
            delay = restarts.wait(time.monotonic() - started)
            print(f"local agent {outcome}; starting it again in {delay:g}s", flush=True)
            if self._stopping.wait(delay):
                return

    def _run_agent(self) -> str | None:
        """Start the agent and wait until it exits: how it ended, or None when `up` ends."""
        with self._lock:
            if self._ending():
                return None
            try:
                self.process = subprocess.Popen(self.command, start_new_session=True)
            except OSError as error:
                return f"could not start ({error})"
        return f"exited with code {self.process.wait()}"
