"""The workloads' network rules (agent/network.py, issue 37 N4): the table the agent writes, the
machine's listeners it reads, and the rank 0 that could not listen on its MASTER_PORT
(agent/rendezvous.py, N3). The rules applied for real, as root with nftables: a workload's
connection refused, another user's not."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import network, rendezvous
from agent.executor import EndCause, Exit, ProcessWorker
from agent.logs import WorkerLog
from agent.master_ports import MasterPorts
from agent.network import Network, Rendezvous, control_plane, gang_rendezvous, ruleset
from agent.start import StartSpec
from tests.support.sandboxed import connects_as, process_uids

UIDS = (2000000, 2065535)
WORKLOADS = "meta skuid 2000000-2065535"


def test_the_table_refuses_workloads_the_control_planes_ports_and_other_gangs() -> None:
    gang = Rendezvous(29501, frozenset({2000007, 2000008}), here=True, peers=("10.0.0.2",))
    elsewhere = Rendezvous(29502, frozenset({2000009}), here=False, address="10.0.0.3")
    text = ruleset("astraeus_x", UIDS, {6379, 5432}, [gang, elsewhere], ("10.0.0.9", 8081))
    assert text.splitlines()[:3] == [
        "table inet astraeus_x {}",
        "delete table inet astraeus_x",  # a stale one of its own replaced, in one go
        "table inet astraeus_x {",
    ]
    rules = [line.strip() for line in text.splitlines() if "reject" in line]
    assert rules == [
        f"{WORKLOADS} fib daddr type local tcp dport {{ 5432, 6379 }} reject with tcp reset",
        f"{WORKLOADS} ip daddr 10.0.0.9 tcp dport 8081 reject with tcp reset",
        f"{WORKLOADS} meta skuid != {{ 2000007, 2000008 }} fib daddr type local tcp dport 29501 "
        "reject with tcp reset",
        f"{WORKLOADS} meta skuid != {{ 2000009 }} ip daddr 10.0.0.3 tcp dport 29502 "
        "reject with tcp reset",
        # from other machines: only the gang's (IPv6: none of its machines has such an address)
        'iif != "lo" meta nfproto ipv4 tcp dport 29501 ip saddr != { 10.0.0.2 } '
        "reject with tcp reset",
        'iif != "lo" meta nfproto ipv6 tcp dport 29501 reject with tcp reset',
    ]


def test_listeners_of_users_that_run_no_workload_are_the_control_plane(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
        "   0: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   108\n"
        "   1: 0100007F:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0\n"
        "   2: 00000000:7339 00000000:0000 0A 00000000:00000000 00:00000000 00000000 2000004\n"
        "   3: 0100007F:1538 0100007F:9C40 01 00000000:00000000 00:00000000 00000000 2000004\n"
        "   4: 3500007F:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000   101\n"
        "   5: 00000000:75C9 00000000:0000 0A 00000000:00000000 00:00000000 00000000 3000001\n"
    )
    found = network.listeners([table])
    assert found == {5432: {108}, 6379: {0}, 29497: {2000004}, 53: {101}, 30153: {3000001}}
    # a workload's (of this install or another's), the resolver's and a gang's port are not
    claims = tmp_path / "claims"
    claims.mkdir()
    (claims / "3000000-3000999.4242.claim").touch()
    ranges = network.workload_ranges(UIDS, claims)
    assert ranges == [UIDS, (3000000, 3000999)]
    assert control_plane(found, ranges) == {5432, 6379}
    assert control_plane(found, ranges, keep_open={6379}) == {5432}


def test_a_gangs_rendezvous_is_read_from_its_workers_starts() -> None:
    def start(rank: int, attempt: int = 1) -> StartSpec:
        return StartSpec(
            workspace_id=3,
            run="ddp",
            attempt=attempt,
            gang_addresses=("10.0.0.1", "10.0.0.2"),
            astraeus_environment={
                "RANK": str(rank),
                "WORLD_SIZE": "3",
                "MASTER_ADDR": "10.0.0.1",
                "MASTER_PORT": "29500",
            },
        )

    alone = StartSpec(run="one", astraeus_environment={"WORLD_SIZE": "1", "MASTER_PORT": "29501"})
    found = gang_rendezvous([(start(0), 2000001), (start(2), 2000003), (alone, 2000009)], {})
    assert found == [
        Rendezvous(29500, frozenset({2000001, 2000003}), True, "10.0.0.1", ("10.0.0.1", "10.0.0.2"))
    ]


def test_a_rank_0_that_could_not_listen_says_so_in_its_own_words() -> None:
    # PyTorch's TCPStore (libuv), and Python's and C's strerror
    assert rendezvous.in_use_said(
        "The server socket has failed to listen on any local network address. port: 29501, "
        "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    )
    assert rendezvous.in_use_said("OSError: [Errno 98] Address already in use")
    assert not rendezvous.in_use_said("Connection closed by peer")


def test_the_users_listening_on_a_port() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert rendezvous.listening(port) == {os.geteuid()}
    assert rendezvous.listening(port) == set()


# User ids of this test process's own range (tests/support/sandboxed.py): another lane's agent
# gives out none of them, and its rules touch none of them; NOBODY runs no workload anywhere.
OURS = process_uids()[0]
NOBODY = 65534

needs_nft = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None,
    reason="the rules are applied as root with nftables (apt-get install nftables)",
)


def connects(port: int, uid: int) -> bool:
    return connects_as(uid, port)


@needs_nft
def test_the_rules_refuse_its_workloads_alone_and_go_with_the_agent(tmp_path: Path) -> None:
    # a service of the machine's (root's, here) on a port of its own; the agent's range is a
    # test's own, far from any other agent's
    uids = (OURS, OURS + 9)
    with socket.socket() as service:
        service.bind(("127.0.0.1", 0))
        service.listen(8)
        port = service.getsockname()[1]
        rules = Network("test" + os.urandom(4).hex(), uids)
        assert rules.start() and rules.enforced
        try:
            rules.update([])
            assert not connects(port, OURS + 3)  # a workload: refused
            assert connects(port, NOBODY)  # anyone else: as before
            listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
            assert f"table inet {rules.table}" in listed.stdout
        finally:
            rules.stop()
        listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
        assert rules.table not in listed.stdout  # gone with it
        assert connects(port, OURS + 3)


@needs_nft
def test_a_dead_agents_table_is_swept_by_the_next(tmp_path: Path) -> None:
    table = network.table_name("dead" + os.urandom(4).hex())
    subprocess.run(["nft", "-f", "-"], input=ruleset(table, (OURS + 10, OURS + 19), []), text=True)
    owners = tmp_path / "owners"
    owners.mkdir()
    (owners / table).write_text(f"{2**22 + 7}\n")  # beyond pid_max: no such process
    assert network.sweep(owners=owners) == [table]
    listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    assert table not in listed.stdout


def squatted_by(uid: int) -> tuple[int, int]:
    """A port another user (``uid``) listens on, and that listener's process."""
    ready, told = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgid(uid)
            os.setuid(uid)
            sock = socket.socket()
            sock.bind(("0.0.0.0", 0))
            sock.listen()
            os.write(told, str(sock.getsockname()[1]).encode())
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(told)
    port = int(os.read(ready, 16))
    os.close(ready)
    return port, pid


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's listener needs root")
def test_a_rank_0_whose_port_was_stolen_after_its_release_is_port_taken(tmp_path: Path) -> None:
    # issue 37 N3: between the agent letting its hold go and PyTorch's TCPStore binding the
    # port, another workload took it; rank 0 exited saying so: not the run's failure
    port, squatter = squatted_by(OURS + 100)
    try:
        ports = MasterPorts()  # of an agent whose workloads' user ids are OURS + 200 to 209
        spec = StartSpec(
            worker="ddp-0",
            workspace_id=1,
            uid=OURS + 201,
            astraeus_environment={"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": str(port)},
        )
        worker = ProcessWorker(7, spec, WorkerLog(tmp_path / "logs", "7"), tmp_path / "7")
        worker.log.begin()
        worker.log.append(
            b"torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            b"local network address. port: %d, useIpv6: false, code: -98, name: EADDRINUSE, "
            b"message: address already in use\n" % port
        )
        ended = ports.refused(worker, Exit(1, EndCause.EXITED), OURS + 201)
        assert (ended.cause, ended.code, ended.detail) == (EndCause.PORT_TAKEN, 1, str(port))
        assert ended.offered_port is not None and ended.offered_port != port
        assert rendezvous.listening(ended.offered_port) == {os.geteuid()}  # held for it
        # its own failure, with the port its own or free, stays its failure
        os.kill(squatter, signal.SIGKILL)
        os.waitpid(squatter, 0)
        assert ports.refused(worker, Exit(1, EndCause.EXITED), OURS + 201).cause == EndCause.EXITED
        # a port no gang came back for is let go after its minute
        held, _ = ports.offers[ended.offered_port]
        ports.offers[ended.offered_port] = (held, time.monotonic() - 1)
        ports.expire_offers()
        assert ports.offers == {} and rendezvous.listening(ended.offered_port) == set()
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(squatter, signal.SIGKILL)
            os.waitpid(squatter, 0)


@contextlib.contextmanager
def another_machine(name: str, host: str, other: str) -> Iterator[list[str]]:
    """A machine at ``other`` that reaches this one at ``host``: a network namespace of its own
    on a veth pair (no address outside this machine); the command prefix that runs in it."""
    ip = shutil.which("ip")
    if ip is None:
        pytest.skip("iproute2's ip is not installed")
    outside, inside = f"{name}o", f"{name}i"
    steps = [
        ["netns", "add", name],
        ["link", "add", outside, "type", "veth", "peer", "name", inside],
        ["link", "set", inside, "netns", name],
        ["addr", "add", f"{host}/30", "dev", outside],
        ["link", "set", outside, "up"],
        ["-n", name, "addr", "add", f"{other}/30", "dev", inside],
        ["-n", name, "link", "set", inside, "up"],
    ]
    try:
        for step in steps:
            subprocess.run([ip, *step], check=True, capture_output=True)
        yield [ip, "netns", "exec", name]
    finally:
        subprocess.run([ip, "link", "del", outside], capture_output=True)
        subprocess.run([ip, "netns", "del", name], capture_output=True)


def connects_from(prefix: list[str], address: str, port: int) -> bool:
    code = f"import socket; socket.create_connection(({address!r}, {port}), timeout=5).close()"
    return (
        subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True).returncode == 0
    )


@needs_nft
def test_only_the_gangs_machines_reach_its_master_port_from_outside() -> None:
    # issue 37 N4 across machines: rank 0's machine lets only the gang's machines' addresses in
    name = "astx" + os.urandom(3).hex()
    host, other = "10.231.7.1", "10.231.7.2"
    with another_machine(name, host, other) as there, socket.socket() as rank0:
        rank0.bind(("0.0.0.0", 0))
        rank0.listen(8)
        port = rank0.getsockname()[1]
        rules = Network("test" + os.urandom(4).hex(), (OURS + 300, OURS + 309))
        assert rules.start()
        try:
            assert connects_from(there, host, port)  # no gang here yet: as before
            theirs = Rendezvous(port, frozenset({OURS + 301}), here=True, peers=(host,))
            rules.update([theirs])
            assert not connects_from(there, host, port)  # not a machine of the gang
            ours = Rendezvous(port, frozenset({OURS + 301}), here=True, peers=(host, other))
            rules.update([ours])
            assert connects_from(there, host, port)  # one of its machines
        finally:
            rules.stop()
