"""The README's first command, for real: `astraeus up` on a fresh data folder (seed L-45)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.live import Server, free_port
from tests.support.http import HTTP

STAMP = r'"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"'
SEED_LINE = (
    'curl -sS "$API/jobs/llama-sft" -H "Authorization: Bearer $ASTRA_TOKEN" '
    "| jq -c '.history[] | [.transition_at, .state, .reason]'"
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "data", free_port())
    try:
        yield running
    finally:
        running.stop()


def seed_curl(server: Server, token: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", SEED_LINE],
        env=server.env_for(token),
        capture_output=True,
        text=True,
    )


@pytest.mark.skipif(not shutil.which("jq") or not shutil.which("curl"), reason="needs curl and jq")
def test_up_then_the_seed_reads_a_run_back_and_another_workspace_cannot(server: Server) -> None:
    printed = server.start()
    assert f"export API={server.url}/v1" in printed
    admin = server.admin_token
    assert admin not in printed  # the log: the token is only in its file

    created = HTTP.post(
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
    # its first row; the local agent may already have placed it (then more rows follow)
    first, *later = answer.stdout.splitlines()
    assert re.fullmatch(rf'\[{STAMP},"Pending","Run created"\]', first), answer.stdout
    for row in later:
        assert re.fullmatch(rf'\[{STAMP},"(Starting|Running|Failed)","[^"]+"\]', row), row

    server.cli("workspace", "create", "team-b")
    other = server.cli("token", "create", "--workspace", "team-b", "--user", "bob").strip()
    refused = seed_curl(server, other)
    assert refused.returncode != 0  # jq finds no history in the 404 answer
    status = HTTP.get(
        f"{server.url}/v1/jobs/llama-sft", headers={"Authorization": f"Bearer {other}"}
    )
    assert status.status_code == 404
    assert "Run created" not in status.text and "train.py" not in status.text

    # A second `up` on the same data folder neither re-creates nor re-prints the admin.
    server.stop()
    again = server.start()
    assert "already set up" in again and admin not in again
