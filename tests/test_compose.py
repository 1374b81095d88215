"""docker-compose.yml: no Docker engine runs here, so its shape is checked instead."""

from pathlib import Path

import yaml

from backend.config import Settings

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"


def test_every_setting_in_the_compose_file_is_a_real_setting() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    fields = {f"ASTRAEUS_{name.upper()}" for name in Settings.model_fields}
    for name, service in services.items():
        for variable in service.get("environment", {}):
            if variable.startswith("ASTRAEUS_"):
                assert variable in fields, f"{name}: {variable} is not a setting"


def test_the_server_processes_share_one_database_and_broker() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    commands = {name: s.get("command") for name, s in services.items()}
    assert commands["migrate"] == ["astraeus", "db", "upgrade"]
    assert commands["api"] == ["astraeus", "serve"]
    assert commands["worker"][:2] == ["astraeus", "worker"]
    assert commands["scheduler"] == ["astraeus", "scheduler"]
    envs = [services[n]["environment"] for n in ("migrate", "api", "worker", "scheduler")]
    assert all(e == envs[0] for e in envs)
    assert envs[0]["ASTRAEUS_BROKER"] == "redis"


def test_the_image_serves_the_console_it_builds() -> None:
    # issue 8: the console is served by the API server, in the image too: a Node stage builds
    # frontend/ and its dist/ lands where Settings looks by default
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    assert "FROM node:20-slim AS console" in dockerfile
    assert "RUN npm ci" in dockerfile and "RUN npm run build" in dockerfile
    assert "COPY --from=console /src/dist ./frontend/dist" in dockerfile
    default = Settings(console_dir=None).resolved_console_dir
    assert default.parts[-2:] == ("frontend", "dist")
