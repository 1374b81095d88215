"""`astraeus up` with its local agent runs real processes as gangs (seed L-29, L-45, L-48, L-51)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.cli.astra.client import EXIT_USAGE
from tests.e2e.live import Server, running
from tests.support import WORKLOAD_PYTHON
from tests.support.http import HTTP
from tests.support.processes import ASTRA, job_when_ended, submit

STEPS = (
    "import os, time\n"
    "for i in range(3):\n"
    "    rank, world = os.environ['RANK'], os.environ['WORLD_SIZE']\n"
    "    print(f'[rank{rank}]: step {i}0 loss 1.8 world {world}', flush=True)\n"
    "    time.sleep(0.2)\n"
)
CRASH = (
    "import os, sys; print('about to fail', flush=True); "
    "sys.exit(1 if os.environ['RANK'] == '1' else 0)"
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    with running(tmp_path_factory.mktemp("embedded") / "data") as live:
        yield live


@pytest.fixture(scope="module")
def llama_sft(live: tuple[Server, str]) -> dict[str, Any]:
    """The gang of the seed's examples, run to its end once for the tests that read it."""
    submit(
        live,
        {"name": "llama-sft", "workers": 2, "gpus": 4, "command": [WORKLOAD_PYTHON, "-c", STEPS]},
    )
    return job_when_ended(live, "llama-sft")


def test_a_gang_of_real_processes_runs_to_completion(
    live: tuple[Server, str], llama_sft: dict[str, Any]
) -> None:
    job = llama_sft
    assert [[h["state"], h["reason"]] for h in job["history"]] == [
        ["Pending", "Run created"],
        ["Starting", "Starting together: 0 of 2 ready"],
        ["Running", "2 of 2 workers running"],
        ["Completed", "2 of 2 workers completed"],
    ]
    server, _ = live
    # Each worker's log is kept under its id (issue 17: names repeat across workspaces).
    logs = (server.log.parent / "data" / "agent" / "logs").glob("*/archived.log")
    assert sorted(log.read_text().splitlines() for log in logs) == [
        [f"[rank{rank}]: step {i}0 loss 1.8 world 2" for i in range(3)] for rank in (0, 1)
    ]


def test_the_local_machine_is_in_a_pool(live: tuple[Server, str]) -> None:
    # so that its time is in the pool ledgers too (seed G-25: `goodput --by pool`)
    server, token = live
    deadline = time.monotonic() + 30
    while True:  # the local agent joins a moment after the server answers
        answer = HTTP.post(
            f"{server.url}/graphql",
            headers={"Authorization": f"Bearer {token}"},
            json={"query": "{ machines { name pool state } pools { name machines } }"},
        ).json()
        if answer["data"]["machines"] or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert answer["data"] == {
        "machines": [{"name": "local", "pool": "local", "state": "ready"}],
        "pools": [{"name": "local", "machines": 1}],
    }


def test_a_failed_rank_fails_the_gang_and_a_missing_command_is_127(
    live: tuple[Server, str],
) -> None:
    submit(
        live,
        {
            "name": "crash",
            "workers": 2,
            "gpus": 1,
            "restart_policy": "never",
            "command": [WORKLOAD_PYTHON, "-c", CRASH],
        },
    )
    submit(
        live,
        {
            "name": "missing",
            "gpus": 1,
            "restart_policy": "never",
            "command": ["no-such-program-here"],
        },
    )
    crash = job_when_ended(live, "crash")
    assert (crash["status"], crash["reason"]) == (
        "Failed",
        "Worker crash-1 failed on local: Exited with code 1; the gang does not run without it",
    )
    missing = job_when_ended(live, "missing")
    assert (missing["status"], missing["reason"]) == (
        "Failed",
        "Worker missing-0 failed on local: Exited with code 127; the gang does not run without it",
    )
    server, token = live
    env = server.env_for(token)
    env["HOME"] = str(server.log.parent)
    status = subprocess.run(
        [str(Path(sys.executable).parent / "astra"), "astraeus", "workers", "crash", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    failed = next(w for w in json.loads(status.stdout) if w["name"] == "crash-1")
    assert (failed["state"], failed["reason"], failed["exitCode"]) == (
        "Failed",
        "Exited with code 1",
        1,
    )


SEED_LOGS = (
    'curl -sS "$API/tasks/llama-sft-1/logs?tail=200" -H "Authorization: Bearer $ASTRA_TOKEN" '
    "| jq -r .logs"
)


def test_the_seeds_log_line_fetches_the_log_from_the_machine(
    live: tuple[Server, str], llama_sft: dict[str, Any]
) -> None:
    # seed L-12, L-14: the log comes from the machine, archived once its process is gone
    server, token = live
    answer = subprocess.run(
        ["bash", "-o", "pipefail", "-c", SEED_LOGS],
        env=server.env_for(token),
        capture_output=True,
        text=True,
    )
    assert answer.returncode == 0, answer.stderr
    # The log's text ends its last line; jq -r adds a newline of its own.
    lines = "".join(f"[rank1]: step {i}0 loss 1.8 world 2\n" for i in range(3))
    assert answer.stdout == lines + "\n"
    body = HTTP.get(
        f"{server.url}/v1/tasks/llama-sft/logs",
        params={"tail": 2},
        headers={"Authorization": f"Bearer {token}"},
    ).json()
    assert body == {
        "task_name": "llama-sft-0",
        "logs": "[rank0]: step 10 loss 1.8 world 2\n[rank0]: step 20 loss 1.8 world 2\n",
        "archived": True,
    }


def test_a_worker_never_placed_has_no_log(live: tuple[Server, str]) -> None:
    # seed L-16: 409 TASK_NOT_PLACED
    submit(live, {"name": "too-big", "gpus": 64, "command": ["true"]})
    server, token = live
    answer = HTTP.get(
        f"{server.url}/v1/tasks/too-big-0/logs", headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 409
    assert answer.json() == {
        "code": "TASK_NOT_PLACED",
        "message": "Worker too-big-0 has not been placed on a machine yet: it has no log.",
    }


def _cgroups_here() -> bool:
    from agent import cgroups

    probe = cgroups.create("probe", "astraeus-test")
    if probe is None:
        return False
    probe.remove()
    return True


@pytest.mark.skipif(not _cgroups_here(), reason="this machine gives no writable cgroup hierarchy")
def test_a_worker_past_its_memory_limit_is_oom_killed(live: tuple[Server, str]) -> None:
    # seed L-52: "OOMKilled: the container exceeded its memory limit", exit code 137
    submit(
        live,
        {
            "name": "hungry",
            "gpus": 1,
            "memory_bytes": 64 * 2**20,
            "restart_policy": "never",
            "command": [WORKLOAD_PYTHON, "-c", "x = bytearray(400 * 2**20); print(len(x))"],
        },
    )
    job = job_when_ended(live, "hungry")
    assert (job["status"], job["reason"]) == (
        "Failed",
        "Worker hungry-0 failed on local: OOMKilled: the container exceeded its memory limit; "
        "the gang does not run without it",
    )


# Issue 4's acceptance, one row a workload: its state, reason, exit code, failure snapshot and
# the log through the seed's own line (seed L-12, L-14, L-21, L-51, L-52).
NOISY_FAILURE = (
    "import sys\n"
    "for i in range(120):\n"
    "    print(f'epoch {i:03d} ' + 'x' * 400, flush=True)\n"
    "sys.exit(3)\n"
)
HANG = "import time; print('loading', flush=True); time.sleep(600)"
WORKLOADS = {
    "steps": (
        {"command": [WORKLOAD_PYTHON, "-c", "for i in range(3): print(f'step {i}')"]},
        ("Completed", "Exited with code 0", 0),
        ["step 0", "step 1", "step 2"],
    ),
    "exits": (
        {"command": [WORKLOAD_PYTHON, "-c", NOISY_FAILURE]},
        ("Failed", "Exited with code 3", 3),
        [f"epoch {i:03d} " + "x" * 400 for i in range(120)],
    ),
    "absent": (
        {"command": ["no-such-program-here"]},
        ("Failed", "Exited with code 127", 127),
        None,  # the shell's own sentence, checked below
    ),
    # Its stall timeout is two of the agent's looks (every 5 s): one of 3 s was found from its
    # start before the look that saw its "loading" had reported it, then taken back as that
    # report came, and found again 5 s later (CI 2026-12-05): the test read it in between.
    "hangs": (
        {"command": [WORKLOAD_PYTHON, "-c", HANG], "stall_timeout": "10s", "on_stall": "keep"},
        ("Running", "Stalled: no progress for 10s", None),
        ["loading"],
    ),
}


def _worker(live: tuple[Server, str], run: str) -> dict[str, Any]:
    server, token = live
    answer = HTTP.post(
        f"{server.url}/graphql",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "query": "query($n: String!) { run(name: $n) { workers { state reason exitCode "
            "lastFailure } } }",
            "variables": {"n": run},
        },
    ).json()
    return dict(answer["data"]["run"]["workers"][0])


def _history(live: tuple[Server, str], run: str) -> str:
    server, token = live
    said = [
        HTTP.get(f"{server.url}/v1{path}", headers={"Authorization": f"Bearer {token}"}).json()
        for path in (f"/jobs/{run}", f"/tasks/{run}-0")
    ]
    return f"{said}\n--- astraeus up's log\n{server.log.read_text()[-3000:]}"


@pytest.mark.parametrize("run", list(WORKLOADS))
def test_each_workload_ends_as_the_seed_says_with_its_snapshot_and_log(
    live: tuple[Server, str], run: str
) -> None:
    spec, (state, reason, code), lines = WORKLOADS[run]
    submit(live, {"name": run, "gpus": 1, "restart_policy": "never", **spec})
    deadline = time.monotonic() + 60
    while (_worker(live, run)["state"], _worker(live, run)["reason"]) != (
        state,
        reason,
    ) and time.monotonic() < deadline:
        time.sleep(0.3)
    worker = _worker(live, run)
    assert (worker["state"], worker["reason"], worker["exitCode"]) == (state, reason, code), (
        _history(live, run)  # what it went through, should this ever fail again
    )
    snapshot = worker["lastFailure"]
    if state == "Failed":
        assert snapshot["reason"] == reason and snapshot["exit_code"] == code
        tail = snapshot["log_tail"]
        assert len(tail.splitlines()) <= 50 and len(tail.encode()) <= 16 * 1024
        if lines is not None:
            assert lines[-1] in tail
            assert lines[-len(tail.splitlines()) + 1] in tail  # the last lines, not the first
    else:
        assert snapshot is None

    server, token = live
    seed_line = (
        f'curl -sS "$API/tasks/{run}-0/logs?tail=200" -H "Authorization: Bearer $ASTRA_TOKEN" '
        "| jq -r .logs"
    )
    printed = subprocess.run(
        ["bash", "-o", "pipefail", "-c", seed_line],
        env=server.env_for(token),
        capture_output=True,
        text=True,
    )
    assert printed.returncode == 0, printed.stderr
    if lines is not None:  # the log ends its last line; jq -r adds a newline of its own
        assert printed.stdout == "".join(f"{line}\n" for line in lines) + "\n"
    else:
        assert "no-such-program-here" in printed.stdout and "not found" in printed.stdout
    body = HTTP.get(
        f"{server.url}/v1/tasks/{run}-0/logs",
        params={"tail": 1},
        headers={"Authorization": f"Bearer {token}"},
    ).json()
    assert body["task_name"] == f"{run}-0"
    assert body.get("archived", False) is (state != "Running")


def astra_cli(live: tuple[Server, str], *args: str, stdin: str | None = None) -> Any:
    server, token = live
    env = server.env_for(token)
    env["HOME"] = str(server.log.parent)  # no config file of the developer's
    return subprocess.run(
        [ASTRA, "astraeus", *args], env=env, input=stdin, capture_output=True, text=True
    )


def until_says(call: Any, text: str) -> Any:
    deadline = time.monotonic() + 30
    while True:
        done = call()
        if text in done.stdout or time.monotonic() > deadline:
            return done
        time.sleep(0.3)


def test_a_pools_price_turns_the_table_into_money(live: tuple[Server, str]) -> None:
    # issue 23: an admin prices the embedded machine's pool; goodput --cost is the money
    unpriced = astra_cli(live, "goodput", "--by", "run", "--cost")
    assert unpriced.returncode == 0 and unpriced.stdout.startswith("No pool has a price")
    bad = astra_cli(live, "price", "set", "local", "cheap")
    assert bad.returncode == EXIT_USAGE and "amount: must be a number" in bad.stderr
    euros = astra_cli(live, "price", "set", "local", "2.5", "--currency", "usd")
    assert euros.returncode != 0 and "currency: must be an ISO 4217 code" in euros.stderr
    # the embedded machine's pool is there once its agent has joined
    done = until_says(lambda: astra_cli(live, "price", "set", "local", "2.5"), "a GPU-hour")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "local on local: 2.50 USD a GPU-hour"
    submitted = astra_cli(
        live, "submit", "-", stdin=json.dumps({"name": "paid", "gpus": 1, "command": ["true"]})
    )
    assert submitted.returncode == 0, submitted.stderr
    cost = astra_cli(live, "goodput", "--by", "run", "--cost")
    assert cost.returncode == 0, cost.stderr
    lines = cost.stdout.splitlines()
    assert lines[0] == "Cost (USD)" and lines[1].split()[:3] == ["RUN", "HELD", "USED"]
    assert lines[-3].startswith("TOTAL ") and lines[-1].startswith("USED = productive; LOST")
    total = json.loads(astra_cli(live, "goodput", "--by", "run", "--cost", "--json").stdout)
    assert total["currency"] == "USD"
    assert lines[-3].split()[1] == f"{total['total']['held']:.2f}"
    by_pool = astra_cli(live, "goodput", "--by", "pool", "--cost")
    assert by_pool.returncode == EXIT_USAGE and "--cost is by workspace or run" in by_pool.stderr
    assert (
        astra_cli(live, "price", "set", "local", "none").stdout.strip()
        == "local on local has no price"
    )
