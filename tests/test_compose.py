"""docker-compose.yml: no Docker engine runs here (nor the compose plugin), so its shape is
checked instead (issue 9): what each service runs, that the API's replicas sit behind one
port for HTTP, WebSockets and gRPC, and that every variable is one Astraeus reads."""

import re
from pathlib import Path

import yaml

from backend.config import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
SERVERS = ("migrate", "api", "worker", "scheduler")


def services() -> dict[str, dict]:  # type: ignore[type-arg]
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])


def test_every_setting_in_the_compose_file_is_a_real_setting() -> None:
    fields = {f"ASTRAEUS_{name.upper()}" for name in Settings.model_fields}
    agent_reads = set(re.findall(r'"(ASTRAEUS_AGENT_\w+)"', (ROOT / "agent/main.py").read_text()))
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
    assert found["proxy"]["ports"] == ["8080:8080", "8081:8081"]
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
