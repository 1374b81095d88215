"""The checkpoint advice live (issue 41): a real two-rank PyTorch DDP run (gloo, CPU) through
`astraeus up` that checkpoints every 120 steps (about 15 s: less often than its agent reads
its progress, every 5 s, as checkpoints are) (tests/workloads/scripts/ddp_train.py, rank 0
saving 64 MB of weights and reporting {"step", "checkpoint_step"} in its progress file), whose
rank 1 is killed three times from outside (SIGKILL, as a machine's fault would): it restarts
from its checkpoint each time, and its advice then shows what it measured (its checkpoints'
cost, their interval, three interruptions "signalled") and the Young-Daly interval with the
GPU-hours a week it would save."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.workloads.conftest import Workloads
from tests.workloads.ledger import Api, spec

RUN = "ckpt"
ADVICE = """query($n: String!) { checkpointAdvice(run: $n) { checkpoints costSeconds
  intervalSeconds scope failures failuresByCause { cause count } gpuHours mtbfSeconds
  optimalIntervalSeconds gpuHoursSavedPerWeek sentence } }"""


def rank_process(worker: str) -> int | None:
    """The pid of the worker's training process (its ASTRAEUS_WORKER, running ddp_train.py)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"ASTRAEUS_WORKER={worker}".encode() in environ and b"ddp_train.py" in command:
            return int(entry.name)
    return None


def rank_1(api: Api) -> tuple[str, str, int]:
    """The run's state, and its rank 1's state and restarts."""
    run = api.graphql(
        "query($n: String!) { run(name: $n) { state workers { name state restarts } } }", n=RUN
    )["run"]
    (worker,) = [w for w in run["workers"] if w["name"] == f"{RUN}-1"]
    return run["state"], worker["state"], worker["restarts"]


def advice(api: Api) -> dict[str, Any]:
    return dict(api.graphql(ADVICE, n=RUN)["checkpointAdvice"])


def until(check: Any, deadline: float, what: str) -> None:
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(1)


def test_a_run_killed_three_times_is_told_how_often_to_checkpoint(
    api: Api, workloads: Workloads, shared_folder: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("kills a workload of another user: needs root")
    script = str(workloads.scripts / "ddp_train.py")
    command = ["python", script, "--steps", "100000", "--sleep", "0.1", "--overwrite-progress"]
    checkpoint = ["--checkpoint", str(shared_folder / "state.pt"), "--checkpoint-every", "120"]
    api.submit(
        spec(
            RUN,
            workloads,
            [*command, *checkpoint, "--checkpoint-mb", "64"],
            restart_policy="on_failure",
        )
    )
    deadline = time.monotonic() + 540
    seen = 0
    for restarts in (0, 1, 2):
        # running this attempt, and a checkpoint more written in it (two in the first)
        until(lambda r=restarts: rank_1(api)[1:] == ("Running", r), deadline, f"try {restarts}")
        more = 2 if restarts == 0 else 1
        until(lambda s=seen + more: advice(api)["checkpoints"] >= s, deadline, "checkpoints")
        seen = advice(api)["checkpoints"]
        pid = rank_process(f"{RUN}-1")
        assert pid is not None, "rank 1's process"
        os.kill(pid, signal.SIGKILL)
        until(lambda r=restarts: rank_1(api)[2] == r + 1, deadline, "its restart")
    until(lambda: rank_1(api)[1] == "Running", deadline, "running again")
    # the tick counts the GPU-hours held (every minute): then the advice has its figures
    until(lambda: advice(api)["optimalIntervalSeconds"] is not None, deadline, "the advice")
    found = advice(api)
    try:
        assert found["scope"] == "pool default" or found["scope"].startswith(("pool ", "cluster "))
        assert found["failures"] == 3
        assert found["failuresByCause"] == [{"cause": "signalled", "count": 3}]
        assert found["checkpoints"] >= 4
        assert found["costSeconds"] is not None and found["intervalSeconds"] > 0
        assert found["gpuHours"] > 0
        assert found["mtbfSeconds"] == pytest.approx(3600 * found["gpuHours"] / (3 * 2))
        assert found["gpuHoursSavedPerWeek"] >= 0
        assert found["sentence"].startswith(("Checkpoint every ", "Checkpointing every "))
        assert "a run of 2 GPUs" in found["sentence"]
    finally:
        api.graphql(f'mutation {{ stopRun(name: "{RUN}") {{ errors {{ message }} }} }}')
