"""A real two-rank PyTorch DDP run (gloo, CPU) through `astraeus up` whose ranks each lose a
helper process to the kernel's OOM killer and train on (issue 36; seed L-34, L-52), with
tests/workloads/scripts/ddp_train.py --oom-child-at: each rank starts a process that grows past
its worker's memory limit at step 5, the kernel kills it, the rank logs it and completes.

Before, each worker was recorded "OOMKilled: the container exceeded its memory limit", 137 (any
kill in the worker's control group was taken for its end), and the run Failed. Now the worker's
end is its main process's: the run completes, each worker "Exited with code 0", and each kill
is counted in task_oom_kills_total (seed: "Processes killed for memory"). Its ledger is checked
to the second against its workers' histories (ledger.py): the time after the kill is the
training's, productive.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.workloads.conftest import Workloads
from tests.workloads.ledger import Api, check_ledger, counted, spec, wait_ended

RUN = "ddp-child-oom"
OOM_AT = 5
# A rank (torch, gloo, its model) holds about 300 MiB: the helper is killed past the rest.
LIMIT = 2**30


@pytest.fixture(scope="module")
def job(api: Api, workloads: Workloads) -> dict[str, Any]:
    script = str(workloads.scripts / "ddp_train.py")
    command = ["python", script, "--steps", "20", "--sleep", "0.25"]
    api.submit(spec(RUN, workloads, [*command, "--oom-child-at", str(OOM_AT)], memory_bytes=LIMIT))
    return wait_ended(api, [RUN], 600)[RUN]


def _oom_kills(api: Api, worker: str, since_ms: int) -> list[float]:
    answer = api.get(
        "/metrics/range",
        metric="task_oom_kills_total",
        match=f"task:{worker}",
        agg="max",
        start=since_ms // 1000,
        end=int(time.time()) + 1,
        step="1s",
    )
    assert answer.status_code == 200, answer.text
    return [v for series in answer.json()["series"] for _, v in series["points"]]


def test_a_rank_whose_helper_was_killed_for_memory_completes(api: Api, job: dict[str, Any]) -> None:
    assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed")
    for rank in (0, 1):
        worker = f"{RUN}-{rank}"
        task = api.get(f"/tasks/{worker}").json()
        assert (task["status"], task["exit_code"], task["last_failure"]) == ("Completed", 0, None)
        lines = api.log(worker).splitlines()
        assert f"rank {rank}: helper ended -9 at step {OOM_AT}, going on" in lines
        assert lines[-1] == f"rank {rank}: done"


def test_each_kill_is_counted_once(api: Api, job: dict[str, Any]) -> None:
    since = int(time.time() * 1000) - 3_600_000
    for rank in (0, 1):
        kills = _oom_kills(api, f"{RUN}-{rank}", since)
        assert (max(kills), kills[-1]) == (1.0, 1.0), kills


def test_the_ledger_is_the_workers_history_to_the_second(api: Api, job: dict[str, Any]) -> None:
    [(history, intervals)] = counted(api, [RUN]).values()
    workers = {w["name"]: w["history"][0] for w in history["workers"]}
    assert {w: (h["state"], h["reason"]) for w, h in workers.items()} == {
        f"{RUN}-0": ("Completed", "Exited with code 0"),
        f"{RUN}-1": ("Completed", "Exited with code 0"),
    }
    ledger = check_ledger(api, RUN, history, intervals)
    categories = {c["category"] for c in ledger["gpuHours"] if c["gpuHours"]}
    assert "failure" not in categories and "restart" not in categories, ledger
    assert ledger["productiveGpuHours"] * 3600 > 5, ledger
