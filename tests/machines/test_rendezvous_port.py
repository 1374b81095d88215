"""The machine's side of a gang's rendezvous (agent/rendezvous.py, issue 20): rank 0's agent
holds MASTER_PORT from the START until the worker's process starts, and finds a port another
program holds; an agent reaches its server from the address it advertises by default."""

from __future__ import annotations

import socket

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
