"""docker-compose.yml: no Docker engine runs here (nor the compose plugin), so its shape is
checked instead (issue 9): what each service runs, that the API's replicas sit behind one
port for HTTP, WebSockets and gRPC, and that every variable is one Astraeus reads."""

import contextlib
import re
import shutil
import socket
import ssl
import stat
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from backend.config import Settings
from backend.errors import AstraeusError
from backend.tls import server_tls

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
SERVERS = ("migrate", "api", "worker", "scheduler")


def services() -> dict[str, dict]:  # type: ignore[type-arg]
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])


def test_every_setting_in_the_compose_file_is_a_real_setting() -> None:
    fields = {f"ASTRAEUS_{name.upper()}" for name in Settings.model_fields}
    agent_reads = set(
        re.findall(r'"(ASTRAEUS_AGENT_\w+)"', (ROOT / "agent/arguments.py").read_text())
    )
    for name, service in services().items():
        known = agent_reads if name == "agent" else fields
        for variable in service.get("environment", {}):
            if variable.startswith("ASTRAEUS_"):
                assert variable in known, f"{name}: {variable} is not read by Astraeus"


def test_the_server_processes_share_one_database_and_broker() -> None:
    found = services()
    commands = {name: s.get("command") for name, s in found.items()}
    assert commands["migrate"] == ["astraeus", "db", "upgrade"]
    assert commands["api"] == ["astraeus", "serve"]
    assert commands["worker"][:2] == ["astraeus", "worker"]
    assert commands["scheduler"] == ["astraeus", "scheduler"]
    envs = [found[n]["environment"] for n in SERVERS]
    assert all(e == envs[0] for e in envs)
    assert envs[0]["ASTRAEUS_BROKER"] == "redis"
    # migrations are an explicit step: every server waits for it to succeed
    for name in ("api", "worker", "scheduler"):
        assert found[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }


def test_two_api_replicas_behind_one_port() -> None:
    found = services()
    assert found["api"]["deploy"]["replicas"] == 2 and "ports" not in found["api"]
    assert found["worker"]["deploy"]["replicas"] == 2
    assert found["proxy"]["ports"] == ["443:8443", "8081:8081"]
    assert "healthcheck" in found["api"] and "healthcheck" in found["proxy"]
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "server api:8080;" in nginx and "server api:8081;" in nginx
    assert "proxy_set_header Upgrade $http_upgrade;" in nginx  # GraphQL subscriptions
    assert "grpc_pass grpc://api_grpc;" in nginx and "http2 on;" in nginx  # agents' streams


def test_the_agent_runs_on_gpu_machines_with_the_nvidia_runtime() -> None:
    agent = services()["agent"]
    assert agent["profiles"] == ["gpu"]
    devices = agent["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert agent["environment"]["ASTRAEUS_AGENT_SERVER"] == "proxy:8081"
    # over TLS, verified with the deployment's CA, as the name the proxy's certificate carries
    assert agent["environment"]["ASTRAEUS_AGENT_CA_FILE"] == "/etc/astraeus/ca.crt"
    assert "./deploy/certs/ca.crt:/etc/astraeus/ca.crt:ro" in agent["volumes"]
    assert agent["environment"]["ASTRAEUS_AGENT_TLS_SERVER_NAME"].startswith("${PUBLIC_HOST:?")
    dockerfile = (ROOT / "Dockerfile.agent").read_text()
    assert "NVIDIA_VISIBLE_DEVICES=all" in dockerfile
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in dockerfile


def test_the_readme_documents_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Settings") :]
    for name in Settings.model_fields:
        assert f"ASTRAEUS_{name.upper()}" in table, f"ASTRAEUS_{name.upper()} is not in the README"


def test_the_image_serves_the_console_it_builds() -> None:
    # issue 8: the console is served by the API server, in the image too: a Node stage builds
    # frontend/ and its dist/ lands where Settings looks by default
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "FROM node:20-slim AS console" in dockerfile
    assert "RUN npm ci" in dockerfile and "RUN npm run build" in dockerfile
    assert "COPY --from=console /src/dist ./frontend/dist" in dockerfile
    default = Settings(console_dir=None).resolved_console_dir
    assert default.parts[-2:] == ("frontend", "dist")


# --- issue 18: TLS and the deployment's secrets ---------------------------------------------

SECRETS = ("PUBLIC_HOST", "POSTGRES_PASSWORD", "REDIS_PASSWORD", "ASTRAEUS_SECRET_KEY")
FILLED = {
    "PUBLIC_HOST": "astraeus.example.com",
    "POSTGRES_PASSWORD": "pg0123abcd",
    "REDIS_PASSWORD": "rd4567efgh",
    "ASTRAEUS_SECRET_KEY": "fernet-key-0123",
}
_VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?:(:[?-])([^}]*))?\}")


def interpolated(text: str, env: dict[str, str]) -> str:
    """docker-compose.yml as compose reads it with ``env`` (its .env): ``${X:-default}`` and
    ``${X:?message}``, where an unset or empty X stops compose with the message."""

    def value(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, form, rest = match.groups()
        found = env.get(name, "")
        if found or form is None:
            return found
        if form == ":?":
            raise ValueError(f"required variable {name} is missing a value: {rest}")
        return rest

    return _VARIABLE.sub(value, text)


def rendered(env: dict[str, str]) -> dict[str, dict]:
    return dict(yaml.safe_load(interpolated(COMPOSE.read_text(), env))["services"])


def test_no_secret_has_a_default_and_compose_names_the_one_missing() -> None:
    text = COMPOSE.read_text()
    for name in SECRETS:
        uses = re.findall(rf"\$\{{{name}([^}}]*)\}}", text)
        assert uses, f"{name} is not used"
        assert all(use.startswith(":?") and ".env" in use for use in uses), (name, uses)
        missing = {k: v for k, v in FILLED.items() if k != name}
        with pytest.raises(ValueError, match=f"required variable {name} is missing a value"):
            rendered(missing)
    # the old default password, or any literal one, is gone
    assert "astraeus@postgres" not in text and "-astraeus}" not in text
    example = (ROOT / "deploy" / "astraeus.env.example").read_text()
    for name in SECRETS:  # the example names each secret, with no value: the admin sets it
        assert re.search(rf"^{name}=$", example, re.M), name
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {".env", "deploy/astraeus.env", "deploy/certs/"} <= set(ignored)


def test_the_servers_reach_postgres_and_redis_with_the_passwords_of_the_env_file() -> None:
    found = rendered(FILLED)
    settings = found["api"]["environment"]
    assert settings["ASTRAEUS_DATABASE_URL"] == (
        "postgresql://astraeus:pg0123abcd@postgres:5432/astraeus"
    )
    assert found["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pg0123abcd"
    assert settings["ASTRAEUS_REDIS_URL"] == "redis://:rd4567efgh@redis:6379/0"
    redis = found["redis"]
    command = redis["command"]
    assert command[command.index("--requirepass") + 1] == "rd4567efgh"
    assert redis["environment"]["REDISCLI_AUTH"] == "rd4567efgh"  # its health check's password
    assert settings["ASTRAEUS_SECRET_KEY"] == "fernet-key-0123"
    assert settings["ASTRAEUS_PUBLIC_URL"] == "https://astraeus.example.com"
    agent = found["agent"]["environment"]
    assert agent["ASTRAEUS_AGENT_TLS_SERVER_NAME"] == "astraeus.example.com"


def test_nginx_terminates_tls_for_browsers_and_agents_and_serves_nothing_in_clear() -> None:
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    config = re.sub(r"#.*", "", nginx)
    assert re.findall(r"^\s*listen\s+([^;]+);", config, re.M) == ["8443 ssl", "8081 ssl"]
    assert "ssl_certificate     /etc/nginx/certs/server.crt;" in config
    assert "ssl_certificate_key /etc/nginx/certs/server.key;" in config
    assert "ssl_protocols       TLSv1.2 TLSv1.3;" in config
    proxy = services()["proxy"]
    assert "./deploy/certs:/etc/nginx/certs:ro" in proxy["volumes"]
    assert proxy["healthcheck"]["test"] == [
        "CMD",
        "curl",
        "-fsSk",
        "https://127.0.0.1:8443/healthz",
    ]
    # Behind it the replicas listen in plaintext, allowed by the setting, on the private
    # network only: no port of theirs is published.
    api = rendered(FILLED)["api"]
    assert "ports" not in api
    env = {k.removeprefix("ASTRAEUS_").lower(): v for k, v in api["environment"].items()}
    assert server_tls(Settings(**env)) is None
    del env["allow_plaintext"]
    with pytest.raises(AstraeusError, match=r"ASTRAEUS_HOST is '0\.0\.0\.0', not a loopback"):
        server_tls(Settings(**env))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_make_certs_makes_a_certificate_the_server_and_its_clients_accept(tmp_path: Path) -> None:
    (tmp_path / "deploy").mkdir()
    script = tmp_path / "deploy" / "make-certs.sh"
    shutil.copy(ROOT / "deploy" / "make-certs.sh", script)
    subprocess.run([str(script), "localhost", "127.0.0.1"], check=True, capture_output=True)
    certs = tmp_path / "deploy" / "certs"
    assert stat.S_IMODE((certs / "server.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((certs / "ca.key").stat().st_mode) == 0o600
    tls = server_tls(Settings(tls_cert=certs / "server.crt", tls_key=certs / "server.key"))
    assert tls is not None
    # A client trusting ca.crt verifies the server as "localhost" (and refuses another name).
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(certs / "server.crt", certs / "server.key")
    client = ssl.create_default_context(cafile=certs / "ca.crt")
    for name, accepted in (("localhost", True), ("elsewhere.example.com", False)):
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            answer = threading.Thread(target=_handshake, args=(listener, server_side))
            answer.start()
            try:
                with socket.create_connection(("127.0.0.1", port)) as raw:
                    client.wrap_socket(raw, server_hostname=name).close()
                ok = True
            except ssl.SSLCertVerificationError:
                ok = False
            answer.join(5)
        assert ok is accepted, name


def _handshake(listener: socket.socket, context: ssl.SSLContext) -> None:
    conn, _ = listener.accept()
    with conn, contextlib.suppress(ssl.SSLError, OSError):
        context.wrap_socket(conn, server_side=True).close()
