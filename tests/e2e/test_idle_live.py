"""Idle policies live (issue 41), on `astraeus up` and its local agent's simulated GPUs (a
simulated GPU is busy while its workload steps, idle otherwise): a run that holds its GPUs and
does nothing is stopped after its window with the policy's reason, one that trains beside it
with the same policy runs on, and one whose policy says notify is told about once and left
running; the workspace's report shows the stop and what it gave back, another workspace's
nothing."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.live import Server, running
from tests.support import WORKLOAD_PYTHON
from tests.support.processes import ASTRA, submit
from tests.workloads.ledger import Api

NOTEBOOK = "import time; print('kernel ready', flush=True); time.sleep(900)"
# A trainer that reports a step a second (its simulated GPUs busy while it steps).
TRAINER = (
    "import os, time\n"
    "path = os.environ['ASTRAEUS_PROGRESS_FILE']\n"
    "for step in range(900):\n"
    "    with open(path, 'w') as f:\n"
    "        f.write(str(step))\n"
    "    time.sleep(1)\n"
)
WINDOW = {"for": "1m"}  # measured over whole minutes: found 2 to 3 minutes after it starts
STOPPED = "Stopped — idle: GPU utilization under 5% for 1 min"
TOLD = "Idle: GPU utilization under 5% for 1 min"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    with running(tmp_path_factory.mktemp("idle") / "data") as live:
        yield live


def run(live: tuple[Server, str], name: str) -> dict[str, Any]:
    return dict(
        Api(*live).graphql(
            "query($n: String!) { run(name: $n) { state reason idlePolicy "
            "{ gpuUtilizationBelow window action } } }",
            n=name,
        )["run"]
    )


def test_an_idle_run_is_stopped_a_busy_one_runs_on_and_a_notice_is_given_once(
    live: tuple[Server, str],
) -> None:
    command = [WORKLOAD_PYTHON, "-c"]
    submit(live, {"name": "notebook", "gpus": 2, "command": [*command, NOTEBOOK], "idle": WINDOW})
    submit(live, {"name": "trainer", "gpus": 2, "command": [*command, TRAINER], "idle": WINDOW})
    told = {**WINDOW, "action": "notify"}
    submit(live, {"name": "watched", "gpus": 1, "command": [*command, NOTEBOOK], "idle": told})
    assert run(live, "notebook")["idlePolicy"] == {
        "gpuUtilizationBelow": 5.0,
        "window": "1m",
        "action": "stop",
    }

    deadline = time.monotonic() + 300
    while (found := run(live, "notebook"))["state"] != "Stopped":
        assert time.monotonic() < deadline, found
        time.sleep(2)
    assert found["reason"] == STOPPED
    # the trainer, as long running beside it, is not stopped
    assert run(live, "trainer")["state"] == "Running"
    assert not run(live, "trainer")["reason"].startswith("Stopping")

    def notices() -> list[tuple[str, str]]:
        page = Api(*live).graphql('{ events(kind: "run.idle") { events { run reason } } }')
        return [(e["run"], e["reason"]) for e in page["events"]["events"]]

    while notices() != [("watched", TOLD)]:
        assert time.monotonic() < deadline, notices()
        time.sleep(2)
    time.sleep(65)  # a minute more of the same idle spell: told once
    assert notices() == [("watched", TOLD)]
    assert run(live, "watched")["state"] == "Running"

    report = Api(*live).graphql(
        "{ idleReport { runsStopped gpuHoursGivenBack idleGpuHoursFound "
        "actions { run action gpus reason gpuHoursGivenBack } } }",
    )["idleReport"]
    assert report["runsStopped"] == 1
    assert report["idleGpuHoursFound"] == pytest.approx(2 / 60)  # 2 GPUs for its minute
    assert 0 < report["gpuHoursGivenBack"] < 2 * 10 / 60  # since its stop, minutes ago
    assert sorted((a["run"], a["action"], a["gpus"], a["reason"]) for a in report["actions"]) == [
        ("notebook", "stop", 2, STOPPED),
        ("watched", "notify", 0, TOLD),
    ]
    # the CLI's describe: its state, its policy, and its checkpoint advice (it reported none)
    server, token = live
    described = subprocess.run(
        [ASTRA, "astraeus", "describe", "notebook"],
        env=server.env_for(token),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert described == [
        f"notebook: Stopped — {STOPPED}",
        "Idle policy: stop it when every GPU stays under 5% for 1m",
        "How often to checkpoint: No checkpoints measured yet: its workload reports "
        "checkpoint_step in its progress file at each checkpoint, a step at a time (two at least)",
    ]
    unknown = subprocess.run(
        [ASTRA, "astraeus", "describe", "nobody"], env=server.env_for(token), capture_output=True
    )
    assert unknown.returncode == 4
    for name in ("trainer", "watched"):
        stopped = Api(*live).graphql(
            "mutation($n: String!) { stopRun(name: $n) { errors { message } } }", n=name
        )
        assert stopped["stopRun"]["errors"] == []
