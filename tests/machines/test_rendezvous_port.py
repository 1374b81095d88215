"""The machine's side of a gang's rendezvous (agent/rendezvous.py, issue 20): rank 0's agent
holds MASTER_PORT from the START until the worker's process starts, and finds a port another
program holds, or another agent's worker (a claim kept machine-wide while it lives); an agent
reaches its server from the address it advertises by default."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from agent import rendezvous


def listening() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a TCPStore binds
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_port_another_program_listens_on_is_found_taken() -> None:
    other = listening()
    try:
        assert rendezvous.reserve(other.getsockname()[1]) is None
    finally:
        other.close()


def test_a_reserved_port_is_held_until_released_then_the_worker_binds_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    held = rendezvous.reserve(port)
    assert held is not None
    try:
        with socket.socket() as intruder:
            intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                intruder.bind(("127.0.0.1", port))
                intruder.listen()
                taken = False
            except OSError:
                taken = True
        assert taken, "another program took the port while it was held"
    finally:
        rendezvous.release(held)
    # released: the worker's process (gloo's TCPStore) listens there
    with socket.socket() as worker:
        worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        worker.bind(("0.0.0.0", port))
        worker.listen()


def test_the_default_address_is_the_local_end_of_the_route_to_the_server() -> None:
    assert rendezvous.route_address("127.0.0.1:8081") == "127.0.0.1"
    assert rendezvous.route_address("[::1]:8081") == "::1"
    # no route, no name: loopback rather than nothing
    assert rendezvous.route_address("no-such-host.invalid:8081") == "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


HOLDER = """
import sys
from pathlib import Path
from agent import rendezvous
claim = rendezvous.claim(int(sys.argv[1]), Path(sys.argv[2]))
assert claim is not None
claim.started()  # its worker's process started: only the machine-wide claim is left
print("held", flush=True)
sys.stdin.read()
"""


def test_a_port_another_agents_worker_uses_is_refused_after_its_process_started(
    tmp_path: Path,
) -> None:
    # Two installs on one machine get ports from servers that do not know each other's runs
    # (both default to 29500-30499); a rank 0 binds its port seconds after its process starts,
    # and another install's agent found the port free in that window.
    port, folder = free_port(), tmp_path / "claims"
    other = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(port), str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        assert rendezvous.claim(port, folder) is None  # but another agent's worker has it
    finally:
        other.communicate("")
    # that worker gone (its agent too): the port is this agent's to claim
    claim = rendezvous.claim(port, folder)
    assert claim is not None and claim.sockets
    claim.end()
    assert claim.lock is None and claim.sockets == []


def test_claims_in_a_folder_that_cannot_hold_them_fall_back_to_binding(tmp_path: Path) -> None:
    port, folder = free_port(), tmp_path / "claims"
    folder.mkdir()
    os.mkfifo(folder / str(port))  # not a file: never blocks, never locks
    claim = rendezvous.claim(port, folder)
    assert claim is not None and claim.lock is None and claim.sockets
    claim.end()
