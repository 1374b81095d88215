"""Issue 18's TLS, played live: `astraeus up` with a certificate the test makes (its own CA), real
`astraeus agent` processes joining over TLS, and agents the network must not fool.

Before issue 18 the server listened in plaintext everywhere (``add_insecure_port``, uvicorn with
no certificate) and the agent connected with ``insecure_channel`` wherever it was pointed: its
machine token crossed any network in clear, and an impostor listening at the server's address
received it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.transport import Transport, TransportRefused
from backend.config import Settings
from backend.errors import AstraeusError
from backend.tls import server_tls
from tests.certificates import Authority
from tests.e2e.live import ASTRAEUS, AgentProcess, Server, end_agent, free_port
from tests.support import WORKLOAD_PYTHON
from tests.support.sandboxed import workload_uids
from tests.support.waiting import wait_for

TOKEN = "astm_this-token-must-never-cross-a-network-in-clear"


@dataclass
class Pki:
    folder: Path
    ca: Path  # the CA that signed the server's certificate
    server_cert: Path
    server_key: Path
    other_ca: Path  # an unrelated CA: what an impostor's certificate is signed by
    impostor_cert: Path
    impostor_key: Path
    client_ca: Authority  # signs agents' client certificates


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = Authority.make("astraeus-test-ca"), Authority.make("impostor-ca")
    server_cert, server_key = ca.issue(folder, "astraeus-server")
    impostor_cert, impostor_key = other.issue(folder, "impostor")
    return Pki(
        folder=folder,
        ca=ca.write(folder),
        server_cert=server_cert,
        server_key=server_key,
        other_ca=other.write(folder),
        impostor_cert=impostor_cert,
        impostor_key=impostor_key,
        client_ca=Authority.make("agents-ca"),
    )


# --- a server over TLS --------------------------------------------------------------------


class TlsServer(Server):
    """`astraeus up` with the test's certificate on both listeners."""

    def __init__(self, data_dir: Path, pki: Pki, **settings: Any) -> None:
        port = free_port()
        super().__init__(
            data_dir,
            port,
            tls_cert=str(pki.server_cert),
            tls_key=str(pki.server_key),
            tls_ca=str(pki.ca),
            **settings,
        )
        self.url = f"https://127.0.0.1:{port}"
        self.trust = ssl.create_default_context(cafile=pki.ca)

    def start(self) -> str:
        """As Server.start, the health check over https verified with the test's CA."""
        self.process = subprocess.Popen(
            [ASTRAEUS, "up"], env=self.env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", verify=self.trust, timeout=1).is_success:
                    return self.log.read_text()
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, self.log.read_text()
            time.sleep(0.2)
        raise AssertionError(f"astraeus up did not answer over https:\n{self.log.read_text()}")

    def call(self, token: str, query: str, **variables: Any) -> dict[str, Any]:
        answer = httpx.post(
            f"{self.url}/graphql",
            headers={"Authorization": f"Bearer {token}"},
            json={"query": query, "variables": variables},
            verify=self.trust,
            timeout=20,
        ).json()
        assert "errors" not in answer, answer
        return dict(answer["data"])

    def machines(self, token: str) -> dict[str, str]:
        found = self.call(token, "{ machines { name state } }")["machines"]
        return {m["name"]: m["state"] for m in found}


class Cluster:
    def __init__(self, server: TlsServer, token: str, root: Path) -> None:
        self.server, self.token, self.root = server, token, root
        self.agents: list[AgentProcess] = []

    def agent(self, name: str, *extra: str) -> AgentProcess:
        agent = AgentProcess(self.server, name, self.root / name, gpus=1, extra=extra)
        self.agents.append(agent)
        agent.start()
        return agent

    def machines(self) -> dict[str, str]:
        return self.server.machines(self.token)

    def close(self) -> None:
        for agent in self.agents:
            agent.end()
        self.server.stop()


def start_cluster(root: Path, pki: Pki, **settings: str) -> tuple[Cluster, str]:
    server = TlsServer(root / "data", pki, lease_time="8s", scheduler_interval="1s", **settings)
    printed = server.start()
    token = (server.data_dir / "admin-token").read_text().strip()
    return Cluster(server, token, root), printed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Cluster]:
    found, _ = start_cluster(tmp_path_factory.mktemp("tls"), pki)
    try:
        yield found
    finally:
        found.close()


def log_of(agent: AgentProcess) -> str:
    return agent.log.read_text(errors="replace") if agent.log.exists() else ""


def refused_handshake(agent: AgentProcess) -> bool:
    return bool(re.search(r"CERTIFICATE_VERIFY_FAILED|handshake failed", log_of(agent), re.I))


# --- listeners that play the network ------------------------------------------------------


class Listener:
    """A listener at an address an agent is pointed at: counts connections and keeps every byte
    received (with a certificate: the TLS records as they came, and what they decrypted to)."""

    def __init__(self, host: str, context: ssl.SSLContext | None = None) -> None:
        self.sock = socket.create_server((host, 0))
        self.port = int(self.sock.getsockname()[1])
        self.context = context
        self.connections = 0
        self.raw = bytearray()
        self.decrypted = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(5)
                self._receive(conn)

    def _receive(self, conn: socket.socket) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.context.wrap_bio(incoming, outgoing, server_side=True) if self.context else None
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.raw += data
            if tls is None:
                continue
            incoming.write(data)
            try:
                tls.do_handshake()
                self.decrypted += tls.read(65536)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                pass
            except ssl.SSLError:
                return  # the handshake failed: nothing more is read
            finally:
                with contextlib.suppress(OSError):
                    conn.sendall(outgoing.read())


def non_loopback_address() -> str:
    """This machine's address on its network (the one its default route leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3: nothing is sent, a route is chosen
        except OSError:
            pytest.skip("this machine has no address off loopback")
        address = str(probe.getsockname()[0])
    assert not ipaddress.ip_address(address).is_loopback
    return address


def agent_command(server: str, data_dir: Path, *extra: str) -> list[str]:
    return [
        ASTRAEUS,
        "agent",
        "--server",
        server,
        "--token",
        TOKEN,
        "--name",
        "victim",
        "--data-dir",
        str(data_dir),
        "--simulate-gpus",
        "1",
        "--workload-uids",  # its own: another lane's agent may hold the default range
        workload_uids(),
        *extra,
    ]


# --- the tests ------------------------------------------------------------------------------


def test_up_serves_https_and_its_local_agent_joins_over_tls(cluster: Cluster, pki: Pki) -> None:
    server = cluster.server
    assert "Astraeus is starting at https://127.0.0.1:" in server.log.read_text()
    answer = httpx.get(f"{server.url}/healthz", verify=server.trust, timeout=5)
    assert answer.status_code == 200
    # Not in clear: plain HTTP on the API's port gets no answer.
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url.replace("https://", "http://") + "/healthz", timeout=5)
    # A client that does not trust the test's CA refuses the certificate.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{server.url}/healthz", timeout=5)
    # `astraeus up`'s own agent verified the certificate (ASTRAEUS_TLS_CA) and joined.
    wait_for("the local machine", lambda: cluster.machines().get("local") == "ready")


def test_an_agent_joins_over_tls_with_the_ca_file_and_runs_a_worker(
    cluster: Cluster, pki: Pki
) -> None:
    cluster.agent("tls-gpu", "--ca-file", str(pki.ca), "--pool", "tls")
    wait_for("tls-gpu ready", lambda: cluster.machines().get("tls-gpu") == "ready")
    created = cluster.server.call(
        cluster.token,
        "mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }",
        s={
            "name": "over-tls",
            "gpus": 1,
            "pool": "tls",
            "restart_policy": "never",
            "command": [WORKLOAD_PYTHON, "-c", "print('hello over tls', flush=True)"],
        },
    )
    assert created["createRun"]["errors"] == []

    def rest(path: str) -> dict[str, Any]:
        return dict(
            httpx.get(
                f"{cluster.server.url}/v1{path}",
                headers={"Authorization": f"Bearer {cluster.token}"},
                verify=cluster.server.trust,
                timeout=10,
            ).json()
        )

    # tls-gpu is the pool's only machine: the worker ran there, and its log comes back over the
    # agent's TLS stream.
    wait_for("over-tls completed", lambda: rest("/jobs/over-tls")["status"] == "Completed")
    query = '{ run(name: "over-tls") { workers { exitCode } } }'
    assert cluster.server.call(cluster.token, query)["run"]["workers"] == [{"exitCode": 0}]
    assert "hello over tls" in rest("/tasks/over-tls-0/logs?tail=10")["logs"]


def test_an_agent_with_another_ca_fails_the_handshake_and_never_joins(
    cluster: Cluster, pki: Pki
) -> None:
    agent = cluster.agent("wrong-ca", "--ca-file", str(pki.other_ca))
    wait_for("the refused handshake in its log", lambda: refused_handshake(agent), 30)
    assert "wrong-ca" not in cluster.machines()
    assert agent.process is not None and agent.process.poll() is None  # it keeps trying


def test_an_agent_checks_the_name_it_is_told_the_certificate_carries(
    cluster: Cluster, pki: Pki
) -> None:
    # As compose's agent reaches the proxy by a name its certificate does not carry.
    named = ("--ca-file", str(pki.ca), "--tls-server-name")
    cluster.agent("by-name", *named, "astraeus-server")
    other = cluster.agent("other-name", *named, "elsewhere.example.com")
    wait_for("by-name ready", lambda: cluster.machines().get("by-name") == "ready")
    wait_for(
        "the refused name in its log",
        lambda: "Hostname Verification Check failed" in log_of(other),
        30,
    )
    assert "other-name" not in cluster.machines()


def test_an_impostor_at_the_servers_address_never_receives_the_token(
    pki: Pki, tmp_path: Path
) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.impostor_cert, pki.impostor_key)
    context.set_alpn_protocols(["h2"])
    impostor = Listener("127.0.0.1", context)
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(
            agent_command(
                f"127.0.0.1:{impostor.port}", tmp_path / "agent", "--ca-file", str(pki.ca)
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            "the agent's refusal of the certificate",
            lambda: "CERTIFICATE_VERIFY_FAILED" in log.read_text(errors="replace"),
            30,
        )
    finally:
        agent.terminate()
        agent.wait(timeout=15)
        impostor.close()
        end_agent(tmp_path / "agent")
    assert impostor.connections >= 1
    assert impostor.decrypted == b""  # the agent refused the certificate: nothing was sent
    assert TOKEN.encode() not in impostor.raw


def test_plaintext_to_an_address_off_loopback_is_refused_before_any_connection(
    tmp_path: Path,
) -> None:
    address = non_loopback_address()
    listener = Listener("0.0.0.0")
    server = f"{address}:{listener.port}"
    try:
        done = subprocess.run(
            agent_command(server, tmp_path / "agent"), capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 2, done
        assert done.stderr.strip() == (
            f"astraeus agent: refusing to connect to {server} in plaintext: it is not a "
            "loopback address, and the machine token would cross the network in clear. Give "
            "the server's CA with --ca-file (ASTRAEUS_AGENT_CA_FILE) or --tls to trust the "
            "system's CAs; --insecure (ASTRAEUS_AGENT_INSECURE=true) allows plaintext on a "
            "network you trust."
        )
        time.sleep(0.5)
        assert listener.connections == 0 and listener.raw == b""

        # The explicit setting allows it: the agent connects in plaintext.
        env = {**os.environ, "ASTRAEUS_AGENT_INSECURE": "true"}
        agent = subprocess.Popen(
            agent_command(server, tmp_path / "agent"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for("a plaintext connection", lambda: listener.connections >= 1, 30)
        finally:
            agent.terminate()
            agent.wait(timeout=15)
    finally:
        listener.close()
        end_agent(tmp_path / "agent")


def test_a_server_with_a_client_ca_requires_agents_to_present_a_certificate(
    pki: Pki, tmp_path: Path
) -> None:
    client_ca = pki.client_ca.write(tmp_path)
    cert, key = pki.client_ca.issue(tmp_path, "gpu-07", client=True)
    found, printed = start_cluster(tmp_path, pki, agent_client_ca=str(client_ca))
    try:
        assert "local agent: not started: ASTRAEUS_AGENT_CLIENT_CA" in printed
        bare = found.agent("no-cert", "--ca-file", str(pki.ca))
        found.agent(
            "gpu-07", "--ca-file", str(pki.ca), "--client-cert", str(cert), "--client-key", str(key)
        )
        wait_for("gpu-07 ready", lambda: found.machines().get("gpu-07") == "ready")
        wait_for("no-cert refused", lambda: "stream to" in log_of(bare), 30)
        assert set(found.machines()) == {"gpu-07"}
    finally:
        found.close()


def test_the_server_refuses_to_listen_in_plaintext_off_loopback(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "ASTRAEUS_HOST": "0.0.0.0",
        "ASTRAEUS_PORT": str(port),
        "ASTRAEUS_AGENT_PORT": str(free_port()),
        "ASTRAEUS_DATABASE_URL": f"sqlite:///{tmp_path / 'astraeus.db'}",
        "ASTRAEUS_DATA_DIR": str(tmp_path),
    }
    done = subprocess.run([ASTRAEUS, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stderr.strip() == (
        "astraeus: ASTRAEUS_HOST is '0.0.0.0', not a loopback address, and the server has no "
        "certificate: set ASTRAEUS_TLS_CERT and ASTRAEUS_TLS_KEY, or ASTRAEUS_ALLOW_PLAINTEXT=true "
        "where a proxy in front of it terminates TLS"
    )
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_tls_settings_are_checked_and_a_refusal_names_the_setting(pki: Pki, tmp_path: Path) -> None:
    assert server_tls(Settings(host="127.0.0.1")) is None
    assert server_tls(Settings(host="localhost")) is None
    assert server_tls(Settings(host="0.0.0.0", allow_plaintext=True)) is None
    tls = server_tls(Settings(host="0.0.0.0", tls_cert=pki.server_cert, tls_key=pki.server_key))
    assert tls is not None and tls.agent_client_ca is None

    def refusal(**settings: Any) -> str:
        with pytest.raises(AstraeusError) as refused:
            server_tls(Settings(**settings))
        return refused.value.message

    assert refusal(tls_cert=pki.server_cert) == (
        "ASTRAEUS_TLS_CERT and ASTRAEUS_TLS_KEY go together: ASTRAEUS_TLS_KEY is unset"
    )
    assert refusal(tls_cert=tmp_path / "none.crt", tls_key=pki.server_key).startswith(
        f"ASTRAEUS_TLS_CERT: {tmp_path / 'none.crt'} cannot be read"
    )
    assert refusal(tls_cert=pki.server_cert, tls_key=pki.impostor_key).startswith(
        f"ASTRAEUS_TLS_KEY: {pki.impostor_key} is not the key of ASTRAEUS_TLS_CERT"
    )
    assert refusal(agent_client_ca=pki.ca) == (
        "ASTRAEUS_AGENT_CLIENT_CA needs TLS: set ASTRAEUS_TLS_CERT and ASTRAEUS_TLS_KEY"
    )

    with pytest.raises(TransportRefused, match="--client-cert and --client-key"):
        Transport(client_cert=pki.server_cert).credentials("127.0.0.1:8081")
    with pytest.raises(TransportRefused, match="give one or the other"):
        Transport(insecure=True, ca_file=pki.ca).credentials("127.0.0.1:8081")
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("a CA\n")
    with pytest.raises(TransportRefused, match=r"--ca-file .*ca\.txt: is not a PEM file"):
        Transport(ca_file=not_pem).credentials("127.0.0.1:8081")
    assert Transport().credentials("127.0.0.1:8081") is None
    assert Transport().credentials("localhost:8081") is None
    assert Transport().credentials("[::1]:8081") is None
