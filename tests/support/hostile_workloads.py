"""Hostile workloads' scripts (issue 37) and a gang's plain-socket rendezvous, for Debian's
python3 (no torch); shared by the live tests on `astraeus up` (tests/workloads/test_network.py,
tests/security/test_workload_sandbox.py) and on the production topology
(tests/e2e/test_topology.py)."""

# N3: binds and holds every port of FIRST..LAST it can (as a squatter would), on IPv4 and IPv6,
# says how many sockets it holds, then sleeps SECONDS.
SQUAT = """
import socket, sys, time
first, last = int(sys.argv[1]), int(sys.argv[2])
held = []
for port in range(first, last + 1):
    for family, anywhere in ((socket.AF_INET, '0.0.0.0'), (socket.AF_INET6, '::')):
        s = socket.socket(family)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((anywhere, port))
            s.listen()
            held.append(s)
        except OSError:
            s.close()
print('holding', len(held), flush=True)
time.sleep(float(sys.argv[3]))
"""

# N5: a fork bomb: COUNT children that sleep; how many it got, and exit 1.
BOMB = r"""
import os, sys, time
started = refused = 0
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except BlockingIOError:
        refused += 1
        continue
    if pid == 0:
        os.close(1), os.close(2)
        time.sleep(20)
        os._exit(0)
    started += 1
print("started", started, "refused", refused, flush=True)
raise SystemExit(1)
"""

# A two-rank gang's rendezvous without torch: rank 0 listens on MASTER_PORT (an address in use
# ends it as a TCPStore's would, "Address already in use") and says where; rank 1 connects to
# MASTER_ADDR:MASTER_PORT until it answers; they greet each other with their run's name, so a
# rank 1 that reached another program's socket fails.
RENDEZVOUS = r"""
import os, socket, time
rank, run = int(os.environ["RANK"]), os.environ["ASTRAEUS_RUN"]
address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("", port))
    server.listen()
    print(f"rank 0 of 2: joined at {address}:{port}", flush=True)
    server.settimeout(300)
    peer, _ = server.accept()
    peer.settimeout(60)
    said = peer.recv(256).decode()
    assert said == f"rank 1 of {run}", said
    peer.sendall(f"rank 0 of {run}".encode())
    print("rank 0 met", said, flush=True)
else:
    deadline = time.monotonic() + 300
    while True:
        try:
            peer = socket.create_connection((address, port), timeout=5)
            break
        except OSError:
            assert time.monotonic() < deadline, f"rank 0 never listened at {address}:{port}"
            time.sleep(0.5)
    peer.settimeout(60)
    peer.sendall(f"rank 1 of {run}".encode())
    said = peer.recv(256).decode()
    assert said == f"rank 0 of {run}", said
    print(f"rank 1 of 2: joined at {address}:{port}; met", said, flush=True)
"""
