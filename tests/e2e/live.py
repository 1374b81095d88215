"""A real Astraeus server in its own process, as `astraeus up` starts it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ASTRAEUS = str(Path(sys.executable).parent / "astraeus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`astraeus up` on a data folder of its own, on a free port."""

    def __init__(self, data_dir: Path, port: int, *, local_agent: bool = True) -> None:
        self.env = {
            **os.environ,
            "ASTRAEUS_DATA_DIR": str(data_dir),
            "ASTRAEUS_PORT": str(port),
            "ASTRAEUS_CONSOLE_DIR": str(data_dir / "no-console"),
            "ASTRAEUS_AGENT_PORT": str(free_port()),
            "ASTRAEUS_LOCAL_AGENT": "true" if local_agent else "false",
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

    def env_for(self, token: str) -> dict[str, str]:
        return {**os.environ, "API": f"{self.url}/v1", "ASTRA_TOKEN": token}
