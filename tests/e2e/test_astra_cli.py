"""`astra astraeus` against a live server: the seed's output shapes and exit codes (L-29..L-31)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backend.cli.astra.client import EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE
from backend.cli.astra.main import EXIT_INTERRUPTED
from tests.e2e.live import Server, free_port, running
from tests.support.processes import ASTRA


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    # No agent: the runs stay pending, and their sentences say why.
    with running(tmp_path_factory.mktemp("astra") / "data", local_agent=False) as live:
        yield live


def astra(
    live: tuple[Server, str], *args: str, stdin: str | None = None, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    server, admin = live
    env = server.env_for(admin if token is None else token)
    env["HOME"] = str(server.log.parent)  # no config file of the developer's
    return subprocess.run(
        [ASTRA, "astraeus", *args], env=env, input=stdin, capture_output=True, text=True
    )


def _until(
    call: Callable[[], subprocess.CompletedProcess[str]], text: str
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + 20
    while True:
        done = call()
        if text in done.stdout or time.monotonic() > deadline:
            return done
        time.sleep(0.2)


def test_submit_status_workers_runs(live: tuple[Server, str], tmp_path: Path) -> None:
    spec = tmp_path / "llama-sft.json"
    spec.write_text(
        json.dumps(
            {"name": "llama-sft", "workers": 2, "gpus": 1, "command": ["python", "train.py"]}
        )
    )
    submitted = astra(live, "submit", str(spec))
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout == "llama-sft: Pending — Run created\n"

    # seed L-29: `<run>: <State> — <reason>`, then name, state, machine, reason per worker.
    # The embedded scheduler looks at the run at once; with no machine yet it says so.
    status = _until(lambda: astra(live, "status", "llama-sft"), "No machine fits")
    assert status.stdout.splitlines() == [
        "llama-sft: Pending — No machine fits: local has no ready machine",
        "  llama-sft-0  Pending  -  Waiting to be placed with its gang",
        "  llama-sft-1  Pending  -  Waiting to be placed with its gang",
    ]
    # seed L-30: the WORKER RANK STATE MACHINE REASON table, the seed's column widths
    workers = astra(live, "workers", "llama-sft")
    assert workers.stdout.splitlines() == [
        "WORKER                        RANK   STATE       MACHINE               REASON",
        "llama-sft-0                   0      Pending     -                     "
        "Waiting to be placed with its gang",
        "llama-sft-1                   1      Pending     -                     "
        "Waiting to be placed with its gang",
    ]
    # seed L-31: runs that have not ended
    runs = astra(live, "runs")
    header, *rows = runs.stdout.splitlines()
    assert header.split() == ["RUN", "STATE", "WORKERS", "GPUS", "CREATED", "REASON"]
    assert [r.split()[:4] for r in rows] == [["llama-sft", "Pending", "2", "2"]]
    assert rows[0].endswith("No machine fits: local has no ready machine")
    as_json = json.loads(astra(live, "workers", "llama-sft", "--json").stdout)
    assert [w["name"] for w in as_json] == ["llama-sft-0", "llama-sft-1"]

    stopped = astra(live, "stop", "llama-sft")
    assert stopped.stdout == "llama-sft: Stopped — Stopped by admin\n"
    assert astra(live, "runs").stdout.splitlines()[1:] == []
    ended = astra(live, "runs", "-a").stdout.splitlines()[1]
    assert ended.split()[:2] == ["llama-sft", "Stopped"]
    deleted = astra(live, "delete", "llama-sft")
    assert deleted.stdout == "llama-sft: Deleted — Deleted by admin\n"
    gone = astra(live, "stop", "llama-sft")
    assert (gone.returncode, gone.stderr) == (
        EXIT_NOT_FOUND,
        "astra: No run named 'llama-sft' in workspace 'default'.\n",
    )


def test_errors_have_exit_codes_scripts_can_rely_on(live: tuple[Server, str]) -> None:
    missing = astra(live, "status", "no-such-run")
    assert missing.returncode == EXIT_NOT_FOUND
    assert missing.stderr == "astra: no run named 'no-such-run' in this workspace\n"

    refused = astra(live, "submit", "-", stdin=json.dumps({"name": "bad", "workers": 0}))
    assert refused.returncode == EXIT_REFUSED
    assert refused.stderr.splitlines() == [
        "astra: the run was refused:",
        "  workers: must be at least 1",
    ]

    unknown = astra(live, "runs", token="astx_" + "9" * 40)
    assert unknown.returncode == EXIT_USAGE
    assert "A valid API token is required" in unknown.stderr

    server, admin = live
    env = {**server.env_for(admin), "API": f"http://127.0.0.1:{free_port()}/v1"}
    down = subprocess.run([ASTRA, "astraeus", "runs"], env=env, capture_output=True, text=True)
    assert down.returncode == EXIT_UNREACHABLE
    assert down.stderr.startswith("astra: cannot reach Astraeus at http://127.0.0.1:")


def test_no_token_anywhere_is_a_usage_error(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ASTRAEUS_DATA_DIR": str(tmp_path)}
    done = subprocess.run([ASTRA, "astraeus", "runs"], env=env, capture_output=True, text=True)
    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith("astra: no API token: set ASTRA_TOKEN")


def test_the_goodput_table(live: tuple[Server, str]) -> None:
    # seed G-24 … G-26: the GPU-hours table, by run over 7 days, by week, one run's own
    submitted = astra(
        live, "submit", "-", stdin=json.dumps({"name": "llm", "gpus": 1, "command": ["true"]})
    )
    assert submitted.returncode == 0, submitted.stderr
    by_run = astra(live, "goodput", "--by", "run", "--days", "7")
    assert by_run.returncode == 0, by_run.stderr
    lines = by_run.stdout.splitlines()
    assert lines[0] == "GPU-hours"
    assert lines[1].split() == [
        "RUN",
        "HELD",
        "USED",
        "GOODPUT",
        "IDLE",
        "STALLED",
        "START",
        "RESTART",
        "FAILURE",
        "PREEMPT",
        "WAITING",
    ]
    assert lines[-3].startswith("TOTAL ") and lines[-1].startswith("USED = productive")
    weekly = astra(live, "goodput", "--weeks", "2", "--by", "pool").stdout
    assert weekly.count("GPU-hours") == 1 and weekly.count("\nWEEK      POOL ") == 1  # issue 21
    own = astra(live, "goodput", "--run", "llm").stdout.splitlines()
    assert own[2].split()[0] == "llm"
    assert json.loads(astra(live, "goodput", "--run", "llm", "--json").stdout)["name"] == "llm"
    missing = astra(live, "goodput", "--run", "nope")
    assert missing.returncode == EXIT_NOT_FOUND
    bad = astra(live, "goodput", "--days", "0")
    assert bad.returncode == EXIT_USAGE and "must be a whole number of 1 or more" in bad.stderr


def test_events_listed_and_followed(live: tuple[Server, str]) -> None:
    # seed L-43, L-46: the workspace's events; issue 7: `events`, `--json`, `-f`
    server, admin = live
    env = {**server.env_for(admin), "HOME": str(server.log.parent)}
    follow = subprocess.Popen(
        [ASTRA, "astraeus", "events", "--run", "evented", "-f"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        header = follow.stdout.readline() if follow.stdout else ""
        assert header.split() == ["TIME", "KIND", "NAME", "STATE", "REASON"]
        spec = json.dumps({"name": "evented", "gpus": 1, "command": ["true"]})
        assert astra(live, "submit", "-", stdin=spec).returncode == 0
        assert astra(live, "stop", "evented").returncode == 0
        seen: list[str] = []
        while not any("Stopped by admin" in line for line in seen):
            line = follow.stdout.readline() if follow.stdout else ""
            assert line, follow.stderr.read() if follow.stderr else ""
            seen.append(line)
        assert seen[0].split(None, 5)[2:] == ["run.state", "evented", "Pending", "Run created\n"]
    finally:
        follow.send_signal(signal.SIGINT)
        assert follow.wait(timeout=10) == EXIT_INTERRUPTED  # Ctrl-C ends a follow, as shells say

    listed = astra(live, "events", "--run", "evented", "--kind", "run.state")
    rows = [row.split(None, 5)[2:] for row in listed.stdout.splitlines()[1:]]
    assert rows[0] == ["run.state", "evented", "Pending", "Run created"]
    assert rows[-1] == ["run.state", "evented", "Stopped", "Stopped by admin"]
    as_json = json.loads(astra(live, "events", "--run", "evented", "--json", "--limit", "2").stdout)
    assert [e["state"] for e in as_json][-1] == "Stopped" and len(as_json) == 2
    assert as_json[0]["createdAt"] <= as_json[1]["createdAt"]  # the newest last, as in the table


def test_history_points_at_the_api(live: tuple[Server, str]) -> None:
    # seed L-45: astra does not print history; the CLI says where it is
    done = astra(live, "history", "llama-sft")
    assert done.returncode == EXIT_USAGE
    assert done.stderr.splitlines()[:2] == [
        "astra does not print history. Use the API:",
        '  curl -sS "$API/jobs/llama-sft" -H "Authorization: Bearer $ASTRA_TOKEN" '
        "| jq -c '.history[] | [.transition_at, .state, .reason]'",
    ]


def test_every_command_speaks_json(live: tuple[Server, str]) -> None:
    spec = json.dumps({"name": "as-json", "gpus": 1, "command": ["true"]})
    submitted = json.loads(astra(live, "submit", "-", "--json", stdin=spec).stdout)
    assert (submitted["name"], submitted["state"]) == ("as-json", "Pending")
    for command in (["status", "as-json"], ["workers", "as-json"], ["runs"], ["gpus"]):
        done = astra(live, *command, "--json")
        assert done.returncode == 0 and isinstance(json.loads(done.stdout), dict | list), command
    stopped = json.loads(astra(live, "stop", "as-json", "--json").stdout)
    assert stopped["state"] == "Stopped"
    deleted = json.loads(astra(live, "delete", "as-json", "--json").stdout)
    assert deleted["state"] == "Deleted"


def test_colour_only_on_a_terminal(live: tuple[Server, str]) -> None:
    # issue 7: colour for a person at a terminal, never in a pipe, nor with NO_COLOR
    spec = json.dumps({"name": "coloured", "gpus": 1, "command": ["true"]})
    assert astra(live, "submit", "-", stdin=spec).returncode == 0
    server, admin = live
    env = {**server.env_for(admin), "HOME": str(server.log.parent), "TERM": "xterm"}

    def on_a_terminal(**extra: str) -> str:
        leader, follower = pty.openpty()
        with os.fdopen(leader, "rb", buffering=0) as out:
            done = subprocess.run(
                [ASTRA, "astraeus", "workers", "coloured"],
                env={**env, **extra},
                stdout=follower,
                stderr=subprocess.PIPE,
            )
            os.close(follower)
            assert done.returncode == 0, done.stderr
            printed = b""
            with contextlib.suppress(OSError):  # EIO: the terminal's other end closed
                while chunk := out.read(4096):
                    printed += chunk
        return printed.decode()

    coloured = on_a_terminal()
    assert "\033[33mPending" in coloured and "\033[0m" in coloured
    plain = on_a_terminal(NO_COLOR="1")
    assert "\033[" not in plain and "Pending" in plain
    piped = astra(live, "workers", "coloured").stdout
    assert "\033[" not in piped
    # the colours sit outside the padding: the columns are where the plain table has them
    assert re.sub(r"\033\[\d+m", "", coloured).replace("\r\n", "\n") == piped
