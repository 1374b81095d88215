"""`astraeus up --demo`: example workloads (examples/) submitted once the server answers, so a
newcomer's console shows real bars, a failure, an OOM kill, an idle notebook and a stall within
minutes. They run on the local agent's 8 simulated GPUs (4 + 1 + 1 + 1 + 1), each worker asking
a quarter of a core so that all six fit on a laptop of two cores."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CREATE = """mutation($spec: JSON!) {
  createRun(spec: $spec) { run { name } errors { code field message } } }"""


def specs(examples: Path = EXAMPLES) -> list[dict[str, Any]]:
    """The demo's runs: a gang that trains, one that fails, one killed for memory, an idle
    notebook and one that stalls."""

    def command(script: str) -> list[str]:
        # The script's text, not its path: the workloads run as users of their own, who may
        # not reach the install's folder (a checkout under a home of mode 0700), and the spec
        # then holds all of the run, for Run again and restarts alike.
        return ["python3", "-c", (examples / script).read_text()]

    runs: list[dict[str, Any]] = [
        {"name": "llama-sft", "workers": 2, "gpus": 2, "command": command("train.py")},
        {"name": "crash", "gpus": 1, "restart_policy": "never", "command": command("fails.py")},
        {
            "name": "big-batch",
            "gpus": 1,
            "memory_bytes": 256 * 2**20,
            "restart_policy": "never",
            "command": command("oom.py"),
        },
        {"name": "notebook", "gpus": 1, "command": command("idle.py")},
        {
            "name": "hang",
            "gpus": 1,
            "stall_timeout": "2m",
            "on_stall": "keep",
            "command": command("stalls.py"),
        },
    ]
    return [{**run, "cpu": 0.25} for run in runs]


def submit(api_url: str, token: str, timeout: float = 60.0) -> list[str]:
    """Once the server answers, each demo run not there yet; what was said of each."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{api_url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.3)
    said = []
    headers = {"Authorization": f"Bearer {token}"}
    for spec in specs():
        try:
            answer = httpx.post(
                f"{api_url}/graphql",
                json={"query": CREATE, "variables": {"spec": spec}},
                headers=headers,
                timeout=10,
            ).json()
        except httpx.HTTPError as exc:
            said.append(f"demo: {spec['name']} not submitted: {exc}")
            continue
        errors = (answer.get("data") or {}).get("createRun", {}).get("errors") or []
        if errors:
            said.append(f"demo: {spec['name']} not submitted: {errors[0]['message']}")
        else:
            said.append(f"demo: submitted {spec['name']}")
    return said


def submit_in_background(api_url: str, token: str) -> threading.Thread:
    def work() -> None:
        for line in submit(api_url, token):
            print(line, file=sys.stderr, flush=True)

    thread = threading.Thread(target=work, name="astraeus-demo", daemon=True)
    thread.start()
    return thread
