"""What a workload may reach on the network (issue 37 N4): nftables rules in a table of this
agent's own, matching only the packets of its workloads' user ids.

Workloads share the machine's network: without rules, a workload reaches every service that
listens on the machine (PostgreSQL as its superuser through trust authentication, Redis,
Slurm's MariaDB, the server's ports) and every gang's rendezvous (another workspace's rank 0's
TCPStore, which it can join or corrupt). The agent, when it is root and nftables is there,
keeps a table ``inet astraeus_<install>`` (its data folder's hash: two installs on one machine
keep two tables) that it makes as it starts (replacing a stale one of its own), rewrites whole
and atomically on every change, and deletes as it stops. Its rules:

- **the control plane**: its workloads' user ids may not connect to a port of the machine's
  own addresses (``fib daddr type local``) where a service of another user listens. Two lists
  together: DENIED_PORTS, always (PostgreSQL, Redis, MariaDB, RabbitMQ, Slurm: refused from
  the first instant, also while such a service restarts or before it listens), and the ports
  the agent finds listened on by a user that runs no workload (/proc/net/tcp and tcp6, read
  every REFRESH_SECONDS and before each worker starts): the server's own ports, whatever they
  are, Grafana, a database on a port of its own. A list alone misses what it does not name;
  the listeners alone miss a service that starts after the look, for up to REFRESH_SECONDS
  (a connection made then is cut at the next look: the rules match every packet, not only
  new connections). Listeners of workloads (any install's user ids, as claimed under
  /run/astraeus/workload-uids) are not the control plane: ranks reach one another. The
  server's agent endpoint (--server) is refused too when it is on another machine.
- **a gang's rendezvous** (MASTER_ADDR:MASTER_PORT): from this machine, only the run's own
  workers' user ids may connect to it (the other workloads of this agent may not); on rank
  0's machine, from other machines, only the gang's machines' addresses (StartWorker's
  gang_addresses) may.

Nothing else is touched: the machine's own users, its services and other installs' workloads
pass as before (a run whose spec names a user of the machine, --allow-user, runs as that user
and is not filtered). Where nft cannot be used (not root, no nftables, a kernel without it,
another executor than processes) the agent says so in its log and ``enforced`` is False
(``why_not`` says why), for the machine's isolation report. UDP is not filtered (no
control-plane service of ours speaks it), nor Unix sockets (PostgreSQL's in /run/postgresql):
those are the file system's.

A table whose agent was killed (SIGKILL: no chance to delete it) would go on matching user ids
that later workloads get: the agent names each table's owner (OWNERS), and every agent deletes
the tables of owners that are gone as it starts, every minute, and when `astraeus up` or a
test ends the workers an agent left (agent/executor.py, end_left_workers).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.start import StartSpec

log = logging.getLogger("astraeus.agent")

TABLE_PREFIX = "astraeus_"
REFRESH_SECONDS = 2.0
NFT_TIMEOUT_SECONDS = 10.0
# Refused to workloads on the machine's own addresses whether or not they listen now:
# PostgreSQL, MariaDB/MySQL, Redis, RabbitMQ (AMQP, management, Erlang's port mapper and its
# distribution port), Slurm's controller, node daemon and accounting daemon.
DENIED_PORTS = (5432, 3306, 6379, 5672, 15672, 4369, 25672, 6817, 6818, 6819)
# Listened on by the machine's own resolver (systemd-resolved on 127.0.0.53): a workload's
# names resolve over TCP too.
ALLOWED_PORTS = frozenset({53})
# Where the agents of this machine claim their workloads' user ids (agent/uid_handover.py).
UID_CLAIMS = Path("/run/astraeus/workload-uids")
TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN = "0A"
# Which agent keeps each table: a file per table naming the agent's pid. A table whose agent
# is gone (killed before it could delete it) is deleted by the next agent that starts here.
OWNERS = Path("/run/astraeus/network")
SWEEP_EVERY = 30  # refreshes between two sweeps of such tables (a minute)


@dataclass(frozen=True)
class Rendezvous:
    """A gang's rendezvous with a worker on this machine: the port, the run's workers' user ids
    here, whether rank 0 is here, MASTER_ADDR as an address (when it is one), and the
    addresses of the gang's machines (empty: unknown, a server before them)."""

    port: int
    uids: frozenset[int]
    here: bool
    address: str = ""
    peers: tuple[str, ...] = ()


def table_name(install: str) -> str:
    return f"{TABLE_PREFIX}{install}"


def ruleset(
    table: str,
    uids: tuple[int, int],
    denied: Iterable[int],
    rendezvous: Iterable[Rendezvous] = (),
    server: tuple[str, int] | None = None,
) -> str:
    """The whole table, as ``nft -f`` reads it: made anew (a stale one replaced) in one go."""
    workloads = f"meta skuid {uids[0]}-{uids[1]}"
    ports = sorted(set(denied))
    out = [
        f"table inet {table} {{}}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        "  chain output {",
        "    type filter hook output priority 0; policy accept;",
    ]
    if ports:
        listed = ", ".join(str(p) for p in ports)
        out.append(f"    {workloads} fib daddr type local tcp dport {{ {listed} }} {REJECT}")
    if server is not None:
        host, port = server
        out.append(f"    {workloads} {_family(host)} daddr {host} tcp dport {port} {REJECT}")
    inbound: list[str] = []
    for r in sorted(rendezvous, key=lambda r: r.port):
        others = f"meta skuid != {{ {', '.join(str(u) for u in sorted(r.uids))} }}"
        if not r.uids:
            others = ""
        if r.here:
            to = "fib daddr type local"
        elif r.address:
            to = f"{_family(r.address)} daddr {r.address}"
        else:
            continue
        out.append(f"    {workloads} {others} {to} tcp dport {r.port} {REJECT}".replace("  ", " "))
        peers = [p for p in r.peers if _is_address(p)]
        if r.here and peers:
            for family in ("ip", "ip6"):
                mine = [p for p in peers if _family(p) == family]
                allowed = f"{family} saddr != {{ {', '.join(sorted(set(mine)))} }} " if mine else ""
                inbound.append(
                    f'    iif != "lo" meta nfproto {_nfproto(family)} tcp dport {r.port} '
                    f"{allowed}{REJECT}"
                )
    out += ["  }", "  chain input {", "    type filter hook input priority 0; policy accept;"]
    out += inbound
    out += ["  }", "}", ""]
    return "\n".join(out)


REJECT = "reject with tcp reset"


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _family(address: str) -> str:
    return "ip6" if ipaddress.ip_address(address).version == 6 else "ip"


def _nfproto(family: str) -> str:
    return "ipv6" if family == "ip6" else "ipv4"


def as_address(host: str) -> str:
    """``host`` as an IP address (resolved when it is a name); "" when it resolves to none."""
    host = host.strip("[]")
    if _is_address(host):
        return host
    with contextlib.suppress(OSError, IndexError, UnicodeError):
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    return ""


def listeners(tables: Iterable[Path] = TCP_TABLES) -> dict[int, set[int]]:
    """The TCP ports listened on on this machine, each with the user ids that listen there."""
    found: dict[int, set[int]] = {}
    for table in tables:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) < 8 or fields[3] != LISTEN:
                    continue
                with contextlib.suppress(ValueError):
                    port = int(fields[1].rpartition(":")[2], 16)
                    found.setdefault(port, set()).add(int(fields[7]))
    return found


def workload_ranges(own: tuple[int, int], claims: Path = UID_CLAIMS) -> list[tuple[int, int]]:
    """This agent's workloads' user ids and those other installs on the machine claimed."""
    ranges = [own]
    with contextlib.suppress(OSError):
        for claim in claims.glob("*-*.claim"):
            first, _, rest = claim.name.partition("-")
            with contextlib.suppress(ValueError):
                ranges.append((int(first), int(rest.partition(".")[0])))
    return ranges


def control_plane(
    found: dict[int, set[int]], workloads: list[tuple[int, int]], keep_open: Iterable[int] = ()
) -> set[int]:
    """The ports some user that runs no workload listens on: the control plane's, to refuse.
    ``keep_open``: ports the agent itself holds for its gangs' rendezvous."""
    kept = set(keep_open) | ALLOWED_PORTS

    def workload(uid: int) -> bool:
        return any(first <= uid <= last for first, last in workloads)

    return {
        port
        for port, owners in found.items()
        if port not in kept and any(not workload(uid) for uid in owners)
    }


@dataclass
class Network:
    """This agent's table: made as it starts, kept up to date, deleted as it stops."""

    install: str
    uids: tuple[int, int]
    server: str = ""
    denied: tuple[int, ...] = DENIED_PORTS
    nft: str = "nft"
    enforced: bool = False
    why_not: str = ""  # why nothing is enforced, when it is not
    _applied: str = field(default="", repr=False)
    _listened: set[int] = field(default_factory=set, repr=False)
    _rendezvous: tuple[Rendezvous, ...] = field(default=(), repr=False)

    @property
    def table(self) -> str:
        return table_name(self.install)

    def start(self) -> bool:
        """Make the table (replacing a stale one); False, saying why in the log, where
        nftables cannot be used here."""
        if os.geteuid() != 0:
            self.why_not = "the agent is not root"
        elif shutil.which(self.nft) is None:
            self.why_not = "nft is not installed (Debian's nftables)"
        else:
            sweep(self.nft)
            self.enforced = True
            self.why_not = self._write(force=True) or ""
            self.enforced = not self.why_not
            if self.enforced:
                _own(self.table)
        if self.enforced:
            log.info("network: workloads' rules in nftables table inet %s", self.table)
        else:
            log.warning(
                "network: NOT enforced (%s): workloads reach the machine's services and other "
                "gangs' rendezvous",
                self.why_not,
            )
        return self.enforced

    def update(self, rendezvous: Iterable[Rendezvous] | None = None) -> None:
        """Look at the machine's listeners again (and take the gangs' rendezvous, when given);
        the table is rewritten when anything changed."""
        if not self.enforced:
            return
        if rendezvous is not None:
            self._rendezvous = tuple(rendezvous)
        keep_open = {r.port for r in self._rendezvous}
        self._listened = control_plane(listeners(), workload_ranges(self.uids), keep_open)
        failed = self._write()
        if failed:
            log.warning("network: the rules could not be updated: %s", failed)

    def stop(self) -> None:
        if not self.enforced:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [self.nft, "delete", "table", "inet", self.table],
                capture_output=True,
                timeout=NFT_TIMEOUT_SECONDS,
            )
        self.enforced, self._applied = False, ""
        with contextlib.suppress(OSError):
            (OWNERS / self.table).unlink()

    def _server(self) -> tuple[str, int] | None:
        """The server's agent endpoint, when it is on another machine (on this one, it is a
        listener the look finds)."""
        host, _, port = self.server.rpartition(":")
        address = as_address(host) if host else ""
        if not address or not port.isdigit() or ipaddress.ip_address(address).is_loopback:
            return None
        return address, int(port)

    def _write(self, force: bool = False) -> str | None:
        """Apply the table if it changed; the error when nft refused it."""
        keep_open = {r.port for r in self._rendezvous}
        denied = (set(self.denied) | self._listened) - keep_open
        text = ruleset(self.table, self.uids, denied, self._rendezvous, self._server())
        if text == self._applied and not force:
            return None
        try:
            done = subprocess.run(
                [self.nft, "-f", "-"],
                input=text,
                capture_output=True,
                text=True,
                timeout=NFT_TIMEOUT_SECONDS,
            )
        except (OSError, subprocess.SubprocessError) as error:
            return str(error)
        if done.returncode != 0:
            return done.stderr.strip() or f"nft exited with {done.returncode}"
        self._applied = text
        return None


def _own(table: str) -> None:
    with contextlib.suppress(OSError):
        OWNERS.mkdir(mode=0o700, parents=True, exist_ok=True)
        (OWNERS / table).write_text(f"{os.getpid()}\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(nft: str = "nft", owners: Path = OWNERS) -> list[str]:
    """Delete the tables of agents that are gone (killed before they could): those whose
    owner file names a process that no longer runs. Tables of no known owner are left."""
    swept = []
    with contextlib.suppress(OSError):
        for owner in owners.iterdir():
            try:
                pid = int(owner.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if _alive(pid) or not owner.name.startswith(TABLE_PREFIX):
                continue
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [nft, "delete", "table", "inet", owner.name],
                    capture_output=True,
                    timeout=NFT_TIMEOUT_SECONDS,
                )
            owner.unlink(missing_ok=True)
            swept.append(owner.name)
    if swept:
        log.info("network: removed the tables of agents gone: %s", ", ".join(swept))
    return swept


def gang_rendezvous(
    starts: Iterable[tuple[StartSpec, int | None]], resolve: dict[str, str]
) -> list[Rendezvous]:
    """The rendezvous of the gangs this agent has workers of, from their starts and the user
    id each runs as (None: unknown). ``resolve``: MASTER_ADDR's addresses (and the gang's
    machines'), by name, kept between calls (a name is looked up once)."""
    gangs: dict[tuple[Any, ...], list[tuple[StartSpec, int | None]]] = {}
    for spec, uid in starts:
        env = spec.astraeus_environment
        if int(env.get("WORLD_SIZE") or 1) < 2 or not env.get("MASTER_PORT"):
            continue
        run = (spec.workspace_id, spec.run, spec.attempt)
        gangs.setdefault((*run, int(env["MASTER_PORT"])), []).append((spec, uid))
    found = []
    for key, members in gangs.items():
        envs = [spec.astraeus_environment for spec, _ in members]
        master = str(envs[0].get("MASTER_ADDR") or "")
        peers = [p for p in members[0][0].gang_addresses if p]
        for name in (master, *peers):
            if name not in resolve:
                resolve[name] = as_address(name) if name else ""
        found.append(
            Rendezvous(
                port=key[-1],
                uids=frozenset(uid for _, uid in members if uid is not None),
                here=any(str(env.get("RANK")) == "0" for env in envs),
                address=resolve[master],
                peers=tuple(resolve[p] for p in peers if resolve[p]),
            )
        )
    return found
