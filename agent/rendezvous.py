"""A gang's rendezvous on this machine: the address other machines reach it at, and the port
rank 0 listens on (MASTER_ADDR, MASTER_PORT).

The server picks MASTER_PORT among the ports none of its live runs uses on the machine; only the
machine knows whether another program listens there. So rank 0's agent binds the port when the
START arrives and holds it (listening, with SO_REUSEADDR: a port left in TIME_WAIT is free)
until the worker's process starts, so that nothing takes it meanwhile. When it is taken, the
start is refused as PORT_TAKEN (issue 37 N3: not the run's failure, no restart counted), and the
agent holds a port the kernel picks for the gang's next placement (offered_port), which the
server gives it (backend/scheduling/service.py). The other ranks never learn another value than
the one the server gave them all: a port picked here alone could not reach them.

What Linux allows here: a listening socket keeps every other user's bind off the port (with or
without SO_REUSEADDR; SO_REUSEPORT shares a port only between sockets of one user id), but the
agent must let go before the worker's process binds the port itself (PyTorch's TCPStore binds
seconds later, after its import, and takes no socket from its parent), and a workload of
another user can bind it in between. So a rank 0 whose process exits saying the address is in
use, while another user listens on its MASTER_PORT, is PORT_TAKEN too (``in_use_said``,
``listening``). The MASTER_PORT range (the server's setting) is not privileged: any workload may
bind a port of it while no gang holds it; that costs the gang it meets one placement, never a
restart, and the offered port is outside the range, where the kernel finds one free.

Agents of other installs on the machine (a second `astraeus up`, an agent per cluster) get
their ports from servers that do not know each other's runs, and a rank 0 binds its port only
seconds after its process starts (PyTorch's import): another agent would find the port free
in between and start a second gang on it, whose ranks then meet the first's. So the port is
also claimed machine-wide, for as long as the worker lives: a file per port in CLAIMS, locked
(flock) by the agent whose worker uses it. The folder is root's (/run) when the agent is root,
where no workload can write; an agent of an ordinary user claims in a folder of its own user.

A rank 0 on a Slurm cluster (agent/slurm_task.py) has no server to pick its port: it takes one
the kernel picks (claim_free), held and claimed the same way, and tells the other ranks.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


def claims_folder() -> Path:
    if os.geteuid() == 0:
        return Path("/run/astraeus/master-ports")
    return Path(tempfile.gettempdir()) / f"astraeus-{os.geteuid()}-master-ports"


@dataclass
class Claim:
    """A MASTER_PORT held for a gang's rank 0: its listening sockets until the worker's process
    starts (it binds the port itself then), its claim's lock until the worker is gone."""

    sockets: list[socket.socket] = field(default_factory=list)
    lock: int | None = None  # the claim file's descriptor, locked
    port: int = 0  # the port held (what claim_free picked)

    def started(self) -> None:
        release(self.sockets)
        self.sockets = []

    def end(self) -> None:
        self.started()
        if self.lock is not None:
            with contextlib.suppress(OSError):
                os.close(self.lock)  # closing the last descriptor drops the lock
            self.lock = None


def claim(port: int, folder: Path | None = None) -> Claim | None:
    """``port`` for a gang's rank 0: claimed machine-wide and bound; None when another
    install's worker has it, or another program listens there. Where the claims' folder cannot
    be used, the port is bound only (and the agent says so in its log)."""
    try:
        lock = _claim_file(folder or claims_folder(), port)
    except BlockingIOError:
        return None  # another agent's worker has it
    held = reserve(port)
    if held is None:
        if lock is not None:
            os.close(lock)
        return None
    return Claim(held, lock, port)


# Picks claim_free tries before it gives up: a pick is refused only where another install's
# worker claimed the kernel's choice (its range overlapping the kernel's), or where IPv6 has it.
FREE_PICKS = 20


def claim_free(folder: Path | None = None) -> Claim | None:
    """A port the kernel picks, bound on every address and claimed machine-wide; None when
    FREE_PICKS picks were all taken. The refused picks stay bound until one is kept, so the
    kernel never offers them again meanwhile."""
    refused: list[socket.socket] = []
    try:
        for _ in range(FREE_PICKS):
            held = reserve(0)
            if held is None:
                continue  # its IPv4 pick is bound on IPv6 by another program
            port = int(held[0].getsockname()[1])
            try:
                lock = _claim_file(folder or claims_folder(), port)
            except BlockingIOError:
                refused += held  # another install's worker has it
                continue
            return Claim(held, lock, port)
        return None
    finally:
        release(refused)


def _claim_file(folder: Path, port: int) -> int | None:
    """``port``'s claim file, locked (BlockingIOError: another holds it); None where the
    claims' folder cannot be used, and the port is bound only."""
    try:
        return _lock(folder, port)
    except BlockingIOError:
        raise
    except OSError as error:
        log.warning("MASTER_PORT %d is not claimed machine-wide (%s): bound only", port, error)
        return None


def _lock(folder: Path, port: int) -> int:
    """The claim file of ``port``, opened and locked (BlockingIOError: another holds it)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(folder / str(port), flags, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{folder / str(port)} is not a file")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


# How the machine is reached when no address is given: the local address of a connection to
# the server (the interface the route to the server goes out of), found without sending a packet.
LOOPBACK = "127.0.0.1"


def route_address(server: str) -> str:
    """The local address this machine reaches ``server`` (host:port) from; 127.0.0.1 when the
    route cannot be found (no network): the address the server's own machine reaches it at."""
    host, _, port = server.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, int(port or 0), type=socket.SOCK_DGRAM
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)  # a datagram socket's connect only picks the route
            local = str(probe.getsockname()[0])
    except (OSError, ValueError, IndexError):
        return LOOPBACK
    return local.partition("%")[0]


def reserve(port: int) -> list[socket.socket] | None:
    """Bind ``port`` on every address of the machine (IPv4, and IPv6 where it has it) and keep
    it; None when another program holds it. Port 0: the kernel's pick for IPv4, the same on
    IPv6. The sockets listen: on Linux a socket only bound does not keep another that sets
    SO_REUSEADDR (as servers, gloo's TCPStore among them, do) from binding the port too, a
    listening one does. Nothing accepts: the ranks start together after the release and connect
    once rank 0's process listens (they retry until it does)."""
    held: list[socket.socket] = []
    for family, anywhere in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this machine
        held.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((anywhere, port))
            sock.listen(1)
        except OSError as error:
            release(held)
            if family == socket.AF_INET6 and error.errno == 99:  # EADDRNOTAVAIL: IPv6 disabled
                return reserve_ipv4(port)
            return None
        port = sock.getsockname()[1]
    return held


def reserve_ipv4(port: int) -> list[socket.socket] | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen(1)
    except OSError:
        sock.close()
        return None
    return [sock]


def release(held: list[socket.socket]) -> None:
    for sock in held:
        with contextlib.suppress(OSError):
            sock.close()


# How long a port offered for a gang's next placement (its MASTER_PORT was taken) stays held.
OFFER_SECONDS = 60.0
# What a process says when the port it would listen on is taken: Linux's strerror (C, Python),
# and libuv's (PyTorch's TCPStore: "... code: -98, name: EADDRINUSE, message: address already
# in use").
IN_USE = ("Address already in use", "address already in use", "EADDRINUSE")


def in_use_said(text: str) -> bool:
    return any(words in text for words in IN_USE)


TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def listening(port: int, tables: tuple[Path, ...] = TCP_TABLES) -> set[int]:
    """The user ids that listen on TCP ``port`` on this machine (any address)."""
    owners: set[int] = set()
    for table in tables:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 7 and fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):
                    owners.add(int(fields[7]))
    return owners


def port_taken_reason(port: int, machine: str) -> str:
    return (
        f"MASTER_PORT {port} is in use on {machine} by another program "
        "(the next start takes another)"
    )
