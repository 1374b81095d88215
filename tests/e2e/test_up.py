"""The README's first command, for real: `astraeus up` on a fresh data folder (seed L-45)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ASTRAEUS = str(Path(sys.executable).parent / "astraeus")
SEED_LINE = (
    'curl -sS "$API/jobs/llama-sft" -H "Authorization: Bearer $ASTRA_TOKEN" '
    "| jq -c '.history[] | [.transition_at, .state, .reason]'"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data_dir: Path, port: int) -> None:
        self.env = {
            **os.environ,
            "ASTRAEUS_DATA_DIR": str(data_dir),
            "ASTRAEUS_PORT": str(port),
            "ASTRAEUS_CONSOLE_DIR": str(data_dir / "no-console"),
        }
        self.env.pop("ASTRAEUS_DATABASE_URL", None)
        self.url = f"http://127.0.0.1:{port}"
        self.log = data_dir.parent / "up.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        self.process = subprocess.Popen(
            [ASTRAEUS, "up"], env=self.env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self.log.read_text()
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, self.log.read_text()
            time.sleep(0.2)
        raise AssertionError(f"astraeus up did not answer:\n{self.log.read_text()}")

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [ASTRAEUS, *args], env=self.env, capture_output=True, text=True, check=True
        )
        return done.stdout

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "data", _free_port())
    try:
        yield running
    finally:
        running.stop()


def seed_curl(server: Server, token: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "API": f"{server.url}/v1", "ASTRA_TOKEN": token}
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", SEED_LINE], env=env, capture_output=True, text=True
    )


@pytest.mark.skipif(not shutil.which("jq") or not shutil.which("curl"), reason="needs curl and jq")
def test_up_then_the_seed_reads_a_run_back_and_another_workspace_cannot(server: Server) -> None:
    printed = server.start()
    token = re.search(r"token:\s+(astx_\S+)", printed)
    assert token, printed
    assert f"export API={server.url}/v1" in printed
    admin = token.group(1)

    created = httpx.post(
        f"{server.url}/graphql",
        headers={"Authorization": f"Bearer {admin}"},
        json={
            "query": "mutation($s: JSON!) "
            "{ createRun(spec: $s) { run { name } errors { message } } }",
            "variables": {
                "s": {
                    "name": "llama-sft",
                    "workers": 2,
                    "gpus": 1,
                    "command": ["python", "train.py"],
                }
            },
        },
    ).json()
    assert created["data"]["createRun"] == {"run": {"name": "llama-sft"}, "errors": []}

    answer = seed_curl(server, admin)
    assert answer.returncode == 0, answer.stderr
    assert re.fullmatch(
        r'\["\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z","Pending","Run created"\]\n', answer.stdout
    ), answer.stdout

    server.cli("workspace", "create", "team-b")
    other = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").strip()
    refused = seed_curl(server, other)
    assert refused.returncode != 0  # jq finds no history in the 404 answer
    status = httpx.get(
        f"{server.url}/v1/jobs/llama-sft", headers={"Authorization": f"Bearer {other}"}
    )
    assert status.status_code == 404
    assert "Run created" not in status.text and "train.py" not in status.text

    # A second `up` on the same data folder neither re-creates nor re-prints the admin.
    server.stop()
    again = server.start()
    assert "already set up" in again and admin not in again
