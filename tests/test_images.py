"""The images docker-compose.yml builds start from what their Dockerfiles copy (issue 36).

No Docker engine runs here, so each image is built as its Dockerfile says, without one: the
files its last stage's COPY lines take from the build context (less what .dockerignore
leaves out) or from an earlier stage, laid out under its WORKDIR; the protocol code its RUN
line generates; its ENV. Its Python sees those files and the installed libraries only, never
the checkout (the server image once copied backend/ but not agent/, which the server imports:
built, `astraeus serve` failed at its first import, and nothing here noticed). Then the
production topology runs from them, as the compose file wires it: `astraeus db upgrade`,
`serve`, `worker` and `scheduler` from the server image on a PostgreSQL and a Redis of the
test's own, `astraeus agent` from the agent image joining it, and a run completes on it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.live import end_agent, free_port
from tests.e2e.services import MISSING, PrivatePostgres, PrivateRedis
from tests.support.http import HTTP
from tests.support.sandboxed import workload_uids

ROOT = Path(__file__).resolve().parent.parent
# Where the console stage's build lands, and what the checkout builds it into (`make console`).
CONSOLE_BUILD = {"/src/dist": ROOT / "frontend" / "dist"}


@dataclass
class Stage:
    """A stage of a Dockerfile: its name, WORKDIR, COPY lines, ENV and RUN lines, CMD."""

    name: str
    workdir: str = "/"
    copies: list[tuple[str | None, list[str], str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def instructions(dockerfile: Path) -> Iterator[tuple[str, str]]:
    """Each instruction (its keyword upper-cased, its arguments), continued lines joined."""
    logical = ""
    for line in dockerfile.read_text().splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        keyword, _, arguments = logical.strip().partition(" ")
        yield keyword.upper(), arguments.strip()
        logical = ""


def stages(dockerfile: Path) -> list[Stage]:
    out: list[Stage] = []
    for keyword, arguments in instructions(dockerfile):
        if keyword == "FROM":
            words = arguments.split()
            out.append(Stage(words[2] if len(words) == 3 and words[1].upper() == "AS" else ""))
        elif keyword == "WORKDIR":
            out[-1].workdir = arguments
        elif keyword == "COPY":
            words = shlex.split(arguments)
            source = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
            paths = [w for w in words if not w.startswith("--")]
            out[-1].copies.append((source, paths[:-1], paths[-1]))
        elif keyword == "ENV":
            out[-1].env.update(dict(pair.split("=", 1) for pair in shlex.split(arguments)))
        elif keyword == "RUN":
            out[-1].runs.append(arguments)
        elif keyword == "CMD":
            out[-1].cmd = json.loads(arguments)
    return out


def ignored(patterns: list[str]) -> re.Pattern[str]:
    """.dockerignore's patterns as one expression over a path relative to the context: a
    pattern that matches a folder leaves out everything in it."""
    parts = []
    for pattern in patterns:
        expression = re.escape(pattern.strip("/"))
        expression = expression.replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        parts.append(expression.replace(r"\?", "[^/]"))
    return re.compile(rf"^({'|'.join(parts)})(/.*)?$")


def copy(source: Path, destination: Path, skip: re.Pattern[str], context: Path) -> None:
    """One COPY source: a folder's contents into ``destination``, a file to it."""
    if source.is_dir():
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(context).as_posix()
            if path.is_file() and not skip.match(relative):
                target = destination / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    else:
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)


@dataclass
class Image:
    """An image's files under ``root`` (its WORKDIR at ``workdir``), the Python that sees
    them and the installed libraries only, and its ENV."""

    root: Path
    workdir: Path
    python: Path
    env: dict[str, str]
    cmd: list[str]

    def command(self, *args: str) -> list[str]:
        """A console script of pyproject.toml (`astraeus …`) as the image's pip made it."""
        return [str(self.python.parent / args[0]), *args[1:]]


def build(dockerfile: Path, into: Path) -> Image:
    """The image of ``dockerfile``'s last stage, built into ``into`` from the checkout."""
    built = stages(dockerfile)
    final = built[-1]
    named = {s.name: s for s in built if s.name}
    patterns = (ROOT / ".dockerignore").read_text().split()
    skip = ignored([p for p in patterns if not p.startswith("#")])
    workdir = into / final.workdir.lstrip("/")
    workdir.mkdir(parents=True)
    for stage_name, sources, destination in final.copies:
        target = workdir / destination if not destination.startswith("/") else into / destination
        for source in sources:
            if stage_name is None:
                found = ROOT / source
                assert found.exists(), f"{dockerfile.name}: COPY {source}: not in the checkout"
                where = target / Path(source).name if destination.endswith("/") else target
                copy(found, target if found.is_dir() else where, skip, ROOT)
                continue
            assert stage_name in named, f"{dockerfile.name}: COPY --from={stage_name}: no stage"
            assert any("npm run build" in r for r in named[stage_name].runs), stage_name
            made = CONSOLE_BUILD.get(source)
            assert made is not None, f"{dockerfile.name}: COPY --from={stage_name} {source}"
            if not (made / "index.html").is_file():
                pytest.fail(f"the console is not built ({made}): run `make console`")
            copy(made, target, skip, made)
    generate(final, workdir)
    return Image(into, workdir, python_for(into, workdir), final.env, final.cmd)


def generate(stage: Stage, workdir: Path) -> None:
    """What the stage's RUN lines make of its files: the protocol's code (grpc_tools from
    the libraries installed here, as the image's pip installs it). Their `pip install` of the
    project is the Python of python_for; adding a user changes no file the tests read."""
    for run in stage.runs:
        for step in (s.strip() for s in run.split("&&")):
            if step.startswith(("mkdir -p gen", "touch gen/", "python -m grpc_tools.protoc")):
                words = shlex.split(step)
                if words[0] == "python":
                    words[0] = sys.executable
                subprocess.run(words, cwd=workdir, check=True, capture_output=True)


def python_for(root: Path, workdir: Path) -> Path:
    """A Python that imports the image's packages as its `pip install -e .` would (the
    project's folders and gen/, pyproject.toml's package list) and every other library from
    this environment's site-packages, but nothing of the checkout."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    project = tomllib.loads((workdir / "pyproject.toml").read_text())
    found = project["tool"]["setuptools"]["packages"]["find"]
    paths = [str(workdir / where) for where in found["where"]]
    libraries = sysconfig.get_paths()["purelib"]  # its .pth files (the checkout's) not read
    asked = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", asked], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    (site / "image.pth").write_text("\n".join([*paths, libraries]) + "\n")
    for script, target in project["project"]["scripts"].items():
        module, function = target.split(":")
        path = venv / "bin" / script
        path.write_text(
            f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {module} import {function}\n"
            f"sys.exit({function}())\n"
        )
        path.chmod(0o755)
    return venv / "bin" / "python"


IMPORTED_FROM = """
import importlib, json, pkgutil, sys
found = {}
for package in ("backend", "agent"):
    try:
        module = importlib.import_module(package)
    except ImportError as e:
        found[package] = f"not importable: {e}"
        continue
    found[package] = module.__file__
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if ".sdk" not in info.name:
            found[info.name] = importlib.import_module(info.name).__file__
print(json.dumps(found))
"""


def clean_env(**more: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("ASTRAEUS_", "PYTHON"))}
    return {**kept, **more}


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Image]:
    root = tmp_path_factory.mktemp("images")
    return {name: build(ROOT / name, root / name) for name in ("Dockerfile", "Dockerfile.agent")}


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.agent"])
def test_every_module_of_the_image_imports_from_its_own_files(
    images: dict[str, Image], dockerfile: str
) -> None:
    image = images[dockerfile]
    done = subprocess.run(
        [str(image.python), "-c", IMPORTED_FROM],
        cwd=image.workdir,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert {"backend", "agent"} <= {name.split(".")[0] for name in found}
    for name, where in found.items():
        assert str(where).startswith(str(image.workdir)), (name, where)
    # every module the checkout has, the image has (none left out by the COPY lines)
    for package in ("backend", "agent"):
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            module = module.removesuffix(".__init__")
            if "sdk" not in module and "__pycache__" not in module:
                assert module in found, f"{dockerfile}: {module} is not in the image"


@dataclass
class Deployment:
    """The compose file's production topology run from the images' files."""

    root: Path
    env: dict[str, str]
    server: Image
    agent: Image
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, image: Image, *args: str, **env: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            image.command(*args),
            cwd=image.workdir,
            env={**self.env, **image.env, **env},
            stdout=(self.root / f"{name}.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        self.processes[name] = process
        return process

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            self.server.command("astraeus", *args),
            cwd=self.server.workdir,
            env={**self.env, **self.server.env},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.root.glob("*.log"))
        )

    def until(self, what: str, check: Any, seconds: float = 90) -> Any:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                assert process.poll() is None, f"{name} ended\n{self.logs()}"
            found = check()
            if found:
                return found
            time.sleep(0.3)
        raise AssertionError(f"{what}, in {seconds:g} s\n{self.logs()}")


def compose_settings(**values: str) -> dict[str, str]:
    """The compose file's settings of the server services, its ${…} filled from ``values``."""
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    settings = compose["x-settings"]
    filled = {}
    for name, value in settings.items():
        text = str(value)
        for variable, given in values.items():
            text = re.sub(r"\$\{" + variable + r"(:[^}]*)?\}", given, text)
        assert "${" not in text, f"{name}: {text}"
        filled[name] = text
    return filled


@pytest.fixture(scope="module")
def deployment(
    images: dict[str, Image], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    if MISSING:
        pytest.skip(MISSING)
    root = tmp_path_factory.mktemp("deployment")
    postgres, redis = PrivatePostgres(), PrivateRedis(root)
    server, agent = images["Dockerfile"], images["Dockerfile.agent"]
    deployed = Deployment(root, {}, server, agent)
    try:
        postgres.start()
        postgres.create_database()
        redis.start()
        settings = compose_settings(
            POSTGRES_PASSWORD="unused", REDIS_PASSWORD="", PUBLIC_HOST="127.0.0.1",
            ASTRAEUS_SECRET_KEY=_fernet_key(), ASTRAEUS_LOG_LEVEL="warning",
        )  # fmt: skip
        # the compose file's database and broker are its own services: the test's instead
        settings |= {"ASTRAEUS_DATABASE_URL": postgres.url, "ASTRAEUS_REDIS_URL": redis.url}
        settings |= {"ASTRAEUS_HOST": "127.0.0.1", "ASTRAEUS_SCHEDULER_INTERVAL": "1s"}
        deployed.env = clean_env(**settings)
        # the server image's ENV names folders its user owns; here, the test's
        server.env = {**server.env, "ASTRAEUS_DATA_DIR": str(root / "server")}
        yield deployed
    finally:
        for process in deployed.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in deployed.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        end_agent(root / "agent-data")
        redis.stop()
        postgres.stop()


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def test_the_compose_topology_runs_from_the_images_files(deployment: Deployment) -> None:
    d = deployment
    assert d.server.cmd == ["astraeus", "serve"]
    assert d.agent.cmd == ["astraeus", "agent"]
    d.cli("db", "upgrade")  # the compose file's `migrate` service
    admin = re.search(r"token:\s+(astx_\S+)", d.cli("bootstrap"))
    assert admin, "bootstrap printed no token"
    port, agent_port = free_port(), free_port()
    d.start(
        "api", d.server, *d.server.cmd, ASTRAEUS_PORT=str(port), ASTRAEUS_AGENT_PORT=str(agent_port)
    )
    d.start("worker", d.server, "astraeus", "worker", "--threads", "2")
    d.start("scheduler", d.server, "astraeus", "scheduler")
    url = f"http://127.0.0.1:{port}"
    d.until("the API never answered", lambda: _healthy(url))
    console = HTTP.get(f"{url}/", timeout=10)
    assert console.status_code == 200 and '<div id="root">' in console.text  # the built console
    token = d.root / "gpu-01.token"
    token.write_text(d.cli("token", "create", "--agent", "--name", "gpu-01"))
    # the agent image runs workers through a Docker engine (its ENV); none runs here, so
    # this machine's agent runs them as processes, with a simulated GPU
    d.start(
        "agent", d.agent, *d.agent.cmd,
        "--server", f"127.0.0.1:{agent_port}", "--token-file", str(token), "--name", "gpu-01",
        "--pool", "default", "--data-dir", str(d.root / "agent-data"), "--simulate-gpus", "1",
        "--heartbeat", "1", "--sample", "1",
        # user ids of its own: another lane's agent may hold the default range (issue 37 N9)
        "--workload-uids", workload_uids(),
        ASTRAEUS_AGENT_EXECUTOR="process",
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {admin.group(1)}"}

    def graphql(query: str, **variables: Any) -> dict[str, Any]:
        answer = HTTP.post(
            f"{url}/graphql", headers=headers, timeout=30,
            json={"query": query, "variables": variables},
        ).json()  # fmt: skip
        assert not answer.get("errors"), answer
        return dict(answer["data"])

    spec = {"name": "from-images", "gpus": 1, "command": ["python3", "-c", "print('hello')"]}
    created = graphql("mutation($s: JSON!) { createRun(spec: $s) { errors { message } } }", s=spec)
    assert created["createRun"]["errors"] == []

    def ended() -> str | None:
        job = HTTP.get(f"{url}/v1/jobs/from-images", headers=headers, timeout=30).json()
        return job["status"] if job["status"] in ("Completed", "Failed", "Stopped") else None

    assert d.until("the run never ended", ended, 120) == "Completed", d.logs()
    logs = HTTP.get(f"{url}/v1/tasks/from-images-0/logs", headers=headers, timeout=30).json()
    assert logs["logs"] == "hello\n"


def _healthy(url: str) -> bool:
    try:
        return HTTP.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
