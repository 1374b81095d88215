"""Every `curl … | jq …` line of the two seed pages, run verbatim by bash against a live
`astraeus up` with API, ASTRA_TOKEN, ASTRALYX_API and ASTRALYX_TOKEN set, and the shape of
each answer checked (issue 6; seed L-22, L-32, L-33, L-40, L-45, L-46, G-27 … G-29)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e.live import Server, running
from tests.support.processes import job_when_ended, submit

pytestmark = pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")

# llama-sft: rank 0 trains; rank 1 writes a little and fails after 7 s (its gang with it).
TRAIN = (
    "import os, sys, time\n"
    "rank = int(os.environ['RANK'])\n"
    "for step in range(30):\n"
    "    print(f'[rank{rank}]: step {step}0 loss 1.402', flush=True)\n"
    "    time.sleep(0.25)\n"
    "    if rank == 1 and step == 28: sys.exit(1)\n"
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    with running(tmp_path_factory.mktemp("curls") / "data") as live:
        yield from _with_runs(live)


def _with_runs(live: tuple[Server, str]) -> Iterator[tuple[Server, str]]:
    submit(
        live,
        {
            "name": "llama-sft",
            "workers": 2,
            "gpus": 1,
            "restart_policy": "never",
            "command": ["python3", "-c", TRAIN],
        },
    )
    assert job_when_ended(live, "llama-sft")["status"] == "Failed"
    submit(live, {"name": "llm", "gpus": 1, "command": ["sleep", "1"]})  # the goodput seed's run
    yield live


def curl(live: tuple[Server, str], line: str) -> str:
    """A seed's line, as written after its `$ `, run by bash."""
    server, token = live
    env = {
        **os.environ,
        "API": f"{server.url}/v1",
        "ASTRA_TOKEN": token,
        "ASTRALYX_API": f"{server.url}/v1",
        "ASTRALYX_TOKEN": token,
    }
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {line}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, (line, done.stdout, done.stderr)
    return done.stdout


def test_a_workers_log(live: tuple[Server, str]) -> None:
    # seed L-12: the last 200 lines, as text (`jq -r .logs`)
    out = curl(
        live,
        'curl -sS "$API/tasks/llama-sft-1/logs?tail=200" -H "Authorization: Bearer $ASTRA_TOKEN"'
        " | jq -r .logs",
    )
    assert "[rank1]: step 280 loss 1.402" in out


def test_a_workers_last_failure(live: tuple[Server, str]) -> None:
    # seed L-22
    out = curl(
        live,
        'curl -sS "$API/tasks/llama-sft-1" -H "Authorization: Bearer $ASTRA_TOKEN"'
        " | jq .last_failure",
    )
    failure = json.loads(out)
    assert set(failure) == {"reason", "failed_at", "exit_code", "log_tail"}
    assert failure["reason"] == "Exited with code 1" and failure["exit_code"] == 1
    assert failure["log_tail"].endswith("[rank1]: step 280 loss 1.402\n")


def test_a_gpus_utilisation_over_the_last_hour(live: tuple[Server, str]) -> None:
    # seed L-40
    out = curl(
        live,
        'curl -sS -G "$API/metrics/range" -H "Authorization: Bearer $ASTRA_TOKEN" \\\n'
        "    --data-urlencode metric=task_gpu_utilization_ratio \\\n"
        "    --data-urlencode match=task:llama-sft-0 \\\n"
        "    --data-urlencode by=gpu --data-urlencode agg=max \\\n"
        "    --data-urlencode start=$(( $(date +%s) - 3600 )) | jq '.series[0]'",
    )
    series = json.loads(out)
    assert series["labels"] == {"gpu": "0"}
    assert series["points"] and all(0 <= value <= 1 for _, value in series["points"])


def test_a_runs_history(live: tuple[Server, str]) -> None:
    # seed L-45
    out = curl(
        live,
        'curl -sS "$API/jobs/llama-sft" -H "Authorization: Bearer $ASTRA_TOKEN"'
        " | jq -c '.history[] | [.transition_at, .state, .reason]'",
    )
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows[0][1:] == ["Pending", "Run created"]
    assert ["Running", "2 of 2 workers running"] in [r[1:] for r in rows]
    assert rows[-1][1] == "Failed"
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", r[0]) for r in rows)


def test_the_workspaces_events(live: tuple[Server, str]) -> None:
    # seed L-46: the console's address, /api/v1
    server, _ = live
    out = curl(
        live,
        f'curl -sS "{server.url}/api/v1/orgs/default/workspaces/default/events'
        '?name=llama-sft&limit=50" -H "Authorization: Bearer $ASTRA_TOKEN"',
    )
    events = json.loads(out)["events"]
    assert 1 < len(events) <= 50 and {e["run"] for e in events} == {"llama-sft"}


def test_the_goodput_lines(live: tuple[Server, str]) -> None:
    # seed G-27, G-28, G-29
    by_machine = json.loads(
        curl(
            live,
            'curl -sS "$ASTRALYX_API/goodput?by=machine&start=2026-10-01T00:00:00Z"'
            ' -H "Authorization: Bearer $ASTRALYX_TOKEN"',
        )
    )
    assert by_machine["by"] == "machine"
    assert by_machine["start"] == "2026-10-01T00:00:00.000000Z"
    assert {"ledgers", "total"} <= set(by_machine)
    weekly = json.loads(
        curl(
            live,
            'curl -sS "$ASTRALYX_API/goodput/weekly?weeks=8&by=run"'
            ' -H "Authorization: Bearer $ASTRALYX_TOKEN"',
        )
    )
    assert weekly["by"] == "run" and len(weekly["weeks"]) == 8
    run = json.loads(
        curl(
            live,
            'curl -sS "$ASTRALYX_API/runs/llm/goodput" -H "Authorization: Bearer $ASTRALYX_TOKEN"',
        )
    )
    assert run["run"] == "llm"
    assert {
        "gpu_hours",
        "allocated_gpu_hours",
        "productive_gpu_hours",
        "lost_gpu_hours",
        "waiting_gpu_hours",
    } <= set(run)
