"""`astra astraeus` against live servers, compared line by line with the seeds' terminal blocks.

The goodput table comes from the seed's two runs played through the real services (a fake
clock, two hours ago) and served by `astraeus up`; the status, workers, gpus and logs blocks
from a real run, llama-sft, on three machines named as in the seed, whose agents present
simulated GPUs as the seed's model.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.live import AgentProcess, Server, running, serving_seed_week
from tests.support import Tenancy, searchable
from tests.support.goodput_table import checked_table, seed_layout
from tests.support.http import HTTP
from tests.support.processes import SEED_BLOCK

ASTRA = str(Path(sys.executable).parent / "astra")
MODEL = "NVIDIA H100 80GB HBM3"


def astra(server: Server, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**server.env_for(token), "HOME": str(server.log.parent)}
    return subprocess.run(
        [ASTRA, "astraeus", *args], env=env, capture_output=True, text=True, timeout=120
    )


# -- the goodput table (seed G-24 … G-26) ----------------------------------------------------


def test_the_layout_rebuilds_the_seeds_own_rows() -> None:
    seed = SEED_BLOCK.splitlines()
    for row in seed[2:5]:
        name, *values = row.split()
        assert seed_layout(name, values) == row


@pytest.fixture(scope="module")
def seed_week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Tenancy]]:
    with serving_seed_week(tmp_path_factory.mktemp("seed-week") / "data") as found:
        yield found


def test_goodput_by_run_is_the_seeds_block_with_the_weeks_figures(
    seed_week: tuple[Server, Tenancy],
) -> None:
    # seed G-24: `astra astraeus goodput --by run --days 7`
    server, tenancy = seed_week
    token = tenancy.member_token
    printed = astra(server, token, "goodput", "--by", "run", "--days", "7")
    assert printed.returncode == 0, printed.stderr
    start = (datetime.now(UTC) - timedelta(days=7)).isoformat()
    api = HTTP.get(
        f"{server.url}/v1/goodput",
        params={"by": "run", "start": start},
        headers={"Authorization": f"Bearer {token}"},
    ).json()
    header = SEED_BLOCK.splitlines()[1]
    assert [row["name"] for row in api["ledgers"]] == ["llm", "sweep-7"]
    rows = [*((row["name"], row) for row in api["ledgers"]), ("TOTAL", api["total"])]
    decimals = checked_table(printed.stdout.splitlines(), header, rows)
    assert decimals == 2  # the week compressed: 8.6 GPU-hours of llm
    # seed G-26: one run's own ledger since it was submitted
    own = astra(server, token, "goodput", "--run", "llm").stdout.splitlines()
    ledger = HTTP.get(
        f"{server.url}/v1/runs/llm/goodput", headers={"Authorization": f"Bearer {token}"}
    ).json()
    checked_table(own, header, [("llm", ledger)])


def test_goodput_by_week_and_pool(seed_week: tuple[Server, Tenancy]) -> None:
    # seed G-25: `astra astraeus goodput --weeks 8 --by pool`
    server, tenancy = seed_week
    token = tenancy.member_token
    printed = astra(server, token, "goodput", "--weeks", "8", "--by", "pool")
    assert printed.returncode == 0, printed.stderr
    weekly = HTTP.get(
        f"{server.url}/v1/goodput/weekly",
        params={"weeks": 8, "by": "pool"},
        headers={"Authorization": f"Bearer {token}"},
    ).json()["weeks"]
    assert len(weekly) == 8
    # issue 21: one table of the seed's block, a row per week and pool (a week with none: the
    # week alone), not eight tables of which seven are empty
    seed = SEED_BLOCK.splitlines()
    rows: list[tuple[str, dict[str, Any]]] = []
    for week in weekly:
        named = [(f"{week['week']}  {row['name']}", row) for row in week["ledgers"]]
        rows += named or [(week["week"], week["total"])]
    totals = [week["total"] for week in weekly]
    held = sum(t["allocated_gpu_hours"] for t in totals)
    used = sum(t["productive_gpu_hours"] for t in totals)
    total = {
        "allocated_gpu_hours": held,
        "productive_gpu_hours": used,
        "waiting_gpu_hours": sum(t["waiting_gpu_hours"] for t in totals),
        "held_gpu_hours": {
            c: sum(t["held_gpu_hours"][c] for t in totals) for c in totals[0]["held_gpu_hours"]
        },
        **({"goodput": used / held} if held else {}),
    }
    rows.append(("TOTAL", total))
    header = seed_layout("WEEK      POOL", seed[1].split()[1:])
    checked_table(printed.stdout.splitlines(), header, rows)
    assert sum(1 for week in weekly if week["ledgers"]) >= 1  # the scenario's week has a row
    assert printed.stdout.count("GPU-hours") == 1


# -- status, workers, gpus and logs -f (seed L-11, L-29, L-30, L-39) --------------------------

# Each rank prints the seed's two lines, then steps with its GPUs busy (97% and 96%) until
# told to finish.
WORKLOAD = """\
import json, os, pathlib, sys, time
rank = os.environ["RANK"]
progress = pathlib.Path(os.environ["ASTRAEUS_PROGRESS_FILE"])
print(f"[rank{rank}]: step 1200 loss 1.873 lr 2.0e-05", flush=True)
print(f"[rank{rank}]: step 1210 loss 1.869 lr 2.0e-05", flush=True)
step = 1210
while not pathlib.Path(sys.argv[1]).exists():
    step += 1
    progress.write_text(json.dumps({"step": step, "gpu_utilization": [0.97, 0.96]}))
    time.sleep(0.5)
"""


def until(
    call: Callable[[], subprocess.CompletedProcess[str]],
    done: Callable[[str], bool],
    seconds: float = 60,
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + seconds
    while True:
        found = call()
        if done(found.stdout) or time.monotonic() > deadline:
            return found
        time.sleep(0.3)


@pytest.fixture(scope="module")
def llama_sft(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, Path]]:
    """A live server, three machines of two GPUs (gpu-07, gpu-08, gpu-09) and llama-sft, two
    workers of two GPUs, running; the path that, once it exists, lets the workers finish."""
    root = searchable(tmp_path_factory.mktemp("llama-sft"))  # the workers look for `go`
    go = root / "go"
    with running(root / "data", local_agent=False) as (server, token):
        agents = [
            AgentProcess(server, name, root / name, gpus=2, model=MODEL)
            for name in ("gpu-07", "gpu-08", "gpu-09")
        ]
        try:
            for agent in agents:
                agent.start()
                # each machine joins before the next, so they are placed in the seed's order
                name = agent.data_dir.name
                joined = until(
                    lambda: astra(server, token, "gpus"), lambda out, name=name: name in out, 30
                )
                assert name in joined.stdout, agent.log.read_text()[-2000:]
            spec = {
                "name": "llama-sft",
                "workers": 2,
                "gpus": 2,
                "restart_policy": "never",
                "command": ["python3", "-c", WORKLOAD, str(go)],
            }
            (root / "llama-sft.json").write_text(json.dumps(spec))
            submitted = astra(server, token, "submit", str(root / "llama-sft.json"))
            assert submitted.returncode == 0, submitted.stderr
            yield server, token, go
        finally:
            go.touch()
            for agent in agents:
                agent.kill()


def test_status_and_workers_are_the_seeds_blocks(llama_sft: tuple[Server, str, Path]) -> None:
    server, token, _ = llama_sft
    # seed L-29
    seed = [
        "llama-sft: Running — 2 of 2 workers running",
        "  llama-sft-0  Running  gpu-07  Container running",
        "  llama-sft-1  Running  gpu-08  Container running",
    ]
    status = until(
        lambda: astra(server, token, "status", "llama-sft"), lambda out: out.splitlines() == seed
    )
    assert status.stdout.splitlines() == seed, (
        astra(server, token, "events", "--run", "llama-sft").stdout
        + astra(server, token, "gpus").stdout
    )
    # seed L-30
    workers = astra(server, token, "workers", "llama-sft")
    assert workers.stdout.splitlines() == [
        "WORKER                        RANK   STATE       MACHINE               REASON",
        "llama-sft-0                   0      Running     gpu-07                Container running",
        "llama-sft-1                   1      Running     gpu-08                Container running",
    ]


def test_gpus_holds_the_seeds_lines(llama_sft: tuple[Server, str, Path]) -> None:
    # seed L-39: the seed's three lines, and the three it leaves out, in order
    server, token, _ = llama_sft
    expected = [
        f"gpu-07/0  {MODEL}  97%  ok  held by llama-sft",
        f"gpu-07/1  {MODEL}  96%  ok  held by llama-sft",
        f"gpu-08/0  {MODEL}  97%  ok  held by llama-sft",
        f"gpu-08/1  {MODEL}  96%  ok  held by llama-sft",
        f"gpu-09/0  {MODEL}  0%  ok  free",
        f"gpu-09/1  {MODEL}  0%  ok  free",
    ]
    gpus = until(lambda: astra(server, token, "gpus"), lambda out: out.splitlines() == expected)
    assert gpus.stdout.splitlines() == expected
    seed = [
        "gpu-07/0  NVIDIA H100 80GB HBM3  97%  ok  held by llama-sft",
        "gpu-07/1  NVIDIA H100 80GB HBM3  96%  ok  held by llama-sft",
        "gpu-09/0  NVIDIA H100 80GB HBM3  0%  ok  free",
    ]
    assert [line for line in expected if line in seed] == seed


def test_logs_follow_is_the_seeds_block(llama_sft: tuple[Server, str, Path]) -> None:
    # seed L-11: `astra astraeus logs llama-sft-1 -f`, until the worker ends
    server, token, go = llama_sft
    until(lambda: astra(server, token, "status", "llama-sft"), lambda out: "Running —" in out)
    env = {**server.env_for(token), "HOME": str(server.log.parent)}
    follow = subprocess.Popen(
        [ASTRA, "astraeus", "logs", "llama-sft-1", "-f"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)
    go.touch()
    out, err = follow.communicate(timeout=90)
    assert (follow.returncode, err) == (0, "")
    assert out.splitlines() == [
        "[rank1]: step 1200 loss 1.873 lr 2.0e-05",
        "[rank1]: step 1210 loss 1.869 lr 2.0e-05",
        "",
        "llama-sft-1: Completed — Exited with code 0",
    ]
    # the run's events, the newest last: how it started and how it ended
    events = until(
        lambda: astra(server, token, "events", "--run", "llama-sft", "--kind", "run.state"),
        lambda out: "Completed" in out,
    )
    header, *rows = events.stdout.splitlines()
    assert header.split() == ["TIME", "KIND", "NAME", "STATE", "REASON"]
    assert [row.split(None, 5)[3:] for row in rows][-2:] == [
        ["llama-sft", "Running", "2 of 2 workers running"],
        ["llama-sft", "Completed", "2 of 2 workers completed"],
    ]
