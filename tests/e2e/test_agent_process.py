"""A real server and real `astraeus agent` processes on loopback: agent restarts, lost leases,
stalls, progress and samples (issue 4's acceptance; seed L-29, L-45, L-48)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.live import AgentProcess
from tests.support import WORKLOAD_PYTHON
from tests.support.processes import Cluster

SURVIVOR = (
    "import time, astraeus_progress\n"
    "for i in range(16):\n"
    "    print(f'step {i}', flush=True)\n"
    "    astraeus_progress.report(i, loss=2.0 - i / 10)\n"
    "    time.sleep(0.5)\n"
)
FAILER = (
    "import sys, time\n"
    "for i in range(6):\n"
    "    print(f'epoch {i}', flush=True)\n"
    "    time.sleep(0.5)\n"
    "print('fatal: boom', flush=True)\n"
    "sys.exit(1)\n"
)
HANGS = "import time; print('loading', flush=True); time.sleep(600)"
# Reports a step every half second for 15 s: three times its stall timeout (5 s, room for a
# report to reach the server late on a loaded machine), so it is stalled unless its reports
# count as progress.
STEPPER = (
    "import time, astraeus_progress\n"
    "for i in range(30):\n"
    "    print(f'step {i}', flush=True)\n"
    "    astraeus_progress.report(i, loss=2.0 - i / 10)\n"
    "    time.sleep(0.5)\n"
)
ENDED = ("Completed", "Failed", "Stopped")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def patient_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Machines' leases of 30 s: an agent killed and started again is back well within one even
    on a loaded machine (CI, beside the whole suite: its new interpreter, imports and stream
    took over the 8 s of the others' lease, and its machine was lost)."""
    c = Cluster(tmp_path, lease="30s")
    try:
        yield c
    finally:
        c.close()


def test_killing_the_agent_mid_run_loses_no_state_change_or_snapshot(
    patient_cluster: Cluster,
) -> None:
    cluster = patient_cluster
    agent = cluster.agent("m1")
    agent.start()
    cluster.submit(
        name="survivor", gpus=1, restart_policy="never", command=[WORKLOAD_PYTHON, "-c", SURVIVOR]
    )
    cluster.submit(
        name="failer", gpus=1, restart_policy="never", command=[WORKLOAD_PYTHON, "-c", FAILER]
    )
    cluster.wait(
        "both running",
        lambda: cluster.status("survivor") == "Running" and cluster.status("failer") == "Running",
    )
    agent.kill()
    time.sleep(3.5)  # failer ends while no agent watches it; well within the lease (30s)
    agent.start()

    cluster.wait("both ended", lambda: cluster.status("survivor") in ("Completed", "Failed"))
    cluster.wait("failer ended", lambda: cluster.status("failer") == "Failed")
    survivor = cluster.get("/jobs/survivor")
    assert (survivor["status"], survivor["reason"]) == ("Completed", "1 of 1 worker completed"), (
        survivor
    )

    failer = cluster.workers("failer")[0]
    assert (failer["state"], failer["reason"], failer["exitCode"]) == (
        "Failed",
        "Exited with code 1",
        1,
    )
    snapshot = failer["lastFailure"]
    assert snapshot["exit_code"] == 1 and snapshot["reason"] == "Exited with code 1"
    assert snapshot["log_tail"].splitlines() == [f"epoch {i}" for i in range(6)] + ["fatal: boom"]

    # The lines written while the agent was away are in the machine's log.
    logs = cluster.get("/tasks/survivor-0/logs?tail=200")
    assert logs["archived"] is True
    assert logs["logs"].splitlines() == [f"step {i}" for i in range(16)]


def test_a_server_restart_loses_no_state_change_and_no_machine(cluster: Cluster) -> None:
    agent = cluster.agent("m1")
    agent.start()
    cluster.submit(
        name="failer", gpus=1, restart_policy="never", command=[WORKLOAD_PYTHON, "-c", FAILER]
    )
    cluster.wait("running", lambda: cluster.status("failer") == "Running")
    assert cluster.server.process is not None
    cluster.server.process.kill()  # no goodbye: the agent just loses its stream
    cluster.server.process.wait()
    time.sleep(10)  # the worker fails meanwhile; longer than the lease (8s)
    cluster.server.start()

    cluster.wait("failed", lambda: cluster.status("failer") == "Failed")
    failer = cluster.workers("failer")[0]
    assert (failer["state"], failer["reason"]) == ("Failed", "Exited with code 1")
    assert failer["lastFailure"]["log_tail"].splitlines()[-1] == "fatal: boom"
    # The machine had a whole lease to come back after the server did: not lost.
    cluster.submit(name="after", gpus=1, command=[WORKLOAD_PYTHON, "-c", "print('ok')"])
    cluster.wait("placed on m1 again", lambda: cluster.status("after") == "Completed")


def test_an_agent_away_past_its_lease_loses_its_machine_and_the_run_moves(
    cluster: Cluster,
) -> None:
    first = cluster.agent("m1")
    first.start()
    cluster.wait("m1 joined", lambda: _joined(first))
    cluster.submit(name="mover", gpus=8, command=[WORKLOAD_PYTHON, "-c", HANGS])
    cluster.wait("running on m1", lambda: cluster.status("mover") == "Running")
    second = cluster.agent("m2")
    second.start()
    cluster.wait("m2 joined", lambda: _joined(second))

    (pid_file,) = (first.data_dir / "workers").glob("*/worker.pid")  # by id, not name
    orphan = int(pid_file.read_text())
    first.kill()
    cluster.wait(
        "placed again on m2",
        lambda: (
            [w["machine"] for w in cluster.workers("mover")] == ["m2"]
            and cluster.status("mover") == "Running"
        ),
        seconds=60,
    )
    history = cluster.get("/jobs/mover")["history"]
    assert [[h["state"], h["reason"]] for h in history] == [
        ["Pending", "Run created"],
        ["Starting", "Starting together: 0 of 1 ready"],
        ["Running", "1 of 1 worker running"],
        [
            "Pending",
            "Restarting in 10s (1/10): Worker mover-0 failed on m1: Machine lost: its lease "
            "expired; the gang does not run without it",
        ],
        ["Starting", "Starting together: 0 of 1 ready"],
        ["Running", "1 of 1 worker running"],
    ]

    # The agent comes back: the worker it still runs is not its machine's any more.
    first.start()
    cluster.wait("the orphan stopped", lambda: not _alive(orphan), seconds=30)


def test_a_worker_that_prints_nothing_is_found_stalled(cluster: Cluster) -> None:
    cluster.agent("m1").start()
    cluster.submit(
        name="quiet",
        gpus=1,
        stall_timeout="3s",
        on_stall="keep",
        command=[WORKLOAD_PYTHON, "-c", HANGS],
    )
    cluster.wait(
        "stalled",
        lambda: cluster.workers("quiet")[0]["reason"] == "Stalled: no progress for 3s",
        seconds=30,
    )
    logs = cluster.get("/tasks/quiet-0/logs?tail=200")
    assert logs["logs"] == "loading\n"


def test_a_workload_reporting_steps_is_never_stalled_and_its_samples_arrive(
    cluster: Cluster,
) -> None:
    cluster.agent("m1").start()
    cluster.submit(
        name="stepper",
        gpus=2,
        stall_timeout="5s",
        restart_policy="never",
        command=[WORKLOAD_PYTHON, "-c", STEPPER],
    )
    started_ms = int(time.time() * 1000)
    cluster.wait("ended", lambda: cluster.status("stepper") in ENDED, seconds=180)
    job = cluster.get("/jobs/stepper")
    assert [h["state"] for h in job["history"]] == [
        "Pending",
        "Starting",
        "Running",
        "Completed",
    ], (job, cluster.workers("stepper"))

    # Its samples reached the server: simulated GPUs busy while it stepped (seed L-34).
    busy = cluster.get(
        f"/metrics/range?metric=task_gpu_utilization_ratio&match=run:stepper&by=gpu"
        f"&start={started_ms - 60_000}&step=1s"
    )
    assert (busy["metric"], busy["kind"]) == ("task_gpu_utilization_ratio", "gauge")
    assert sorted(s["labels"]["gpu"] for s in busy["series"]) == ["0", "1"]
    for series in busy["series"]:
        assert max(v for _, v in series["points"]) == 0.95
    if Path("/sys/fs/cgroup/memory").is_dir() or Path("/sys/fs/cgroup/cgroup.controllers").exists():
        memory = cluster.get(
            f"/metrics/range?metric=task_memory_used_bytes&match=run:stepper"
            f"&start={started_ms - 60_000}&step=1s"
        )
        assert memory["series"] and all(v > 0 for _, v in memory["series"][0]["points"])


def _joined(agent: AgentProcess) -> bool:
    return agent.log.exists() and "joined as machine" in agent.log.read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().rpartition(")")[2].split()[0] != "Z"


USES_CREDENTIALS = (
    "import hashlib, os, pathlib\n"
    "token = os.environ['HF_TOKEN']\n"
    "from_file = pathlib.Path(os.environ['ASTRAEUS_SECRETS_DIR'], 'token.txt').read_text()\n"
    "print('same value in both:', token == from_file)\n"
    "print('sha256:', hashlib.sha256(token.encode()).hexdigest()[:12])\n"
    "print('drive:', pathlib.Path(os.environ['ASTRAEUS_DRIVE_DATA'], 'hello.txt').read_text())\n"
    "print('linked:', pathlib.Path(os.environ['MOUNT'], 'hello.txt').read_text())\n"
)


def test_a_worker_waits_for_its_external_secret_then_gets_it_and_its_filled_drive(
    cluster: Cluster, tmp_path: Path
) -> None:
    # seed L-64, L-65: Preparing with "waiting for external secret …", drives filled first
    import hashlib

    secret = "hf_not-a-real-token-42"
    source = tmp_path / "source"
    source.mkdir()
    (source / "hello.txt").write_text("hi from the drive")
    mount = tmp_path / "mnt" / "data"
    mount.parent.mkdir()
    # issue 17: the machine's owner allows filling drives from, and linking them under, these
    roots = ["--fill-from-root", str(tmp_path), "--mount-root", str(mount.parent)]
    cluster.agent("m1", *roots).start()
    declared = cluster.graphql(
        'mutation { setSecret(name: "hf-token") { secret { name external isSet } } }'
    )
    assert declared["setSecret"]["secret"] == {"name": "hf-token", "external": True, "isSet": False}
    cluster.submit(
        name="tuned",
        gpus=1,
        restart_policy="never",
        environment={"MOUNT": str(mount)},
        credentials=[
            {"secret": "hf-token", "env": "HF_TOKEN"},
            {"secret": "hf-token", "file": "token.txt"},
        ],
        mounts=[{"drive": "data", "path": str(mount), "fill_from": str(source)}],
        command=[WORKLOAD_PYTHON, "-c", USES_CREDENTIALS],
    )
    cluster.wait(
        "waiting for the secret",
        lambda: (
            [(w["state"], w["reason"]) for w in cluster.workers("tuned")]
            == [("Preparing", "waiting for external secret hf-token")]
        ),
    )
    cluster.graphql(
        'mutation($v: String!) { setSecret(name: "hf-token", value: $v) { errors { message } } }',
        v=secret,
    )
    cluster.wait("completed", lambda: cluster.status("tuned") == "Completed")
    logs = cluster.get("/tasks/tuned-0/logs?tail=200")["logs"]
    assert logs.splitlines() == [
        "same value in both: True",
        f"sha256: {hashlib.sha256(secret.encode()).hexdigest()[:12]}",
        "drive: hi from the drive",
        "linked: hi from the drive",
    ]
    # The value is shown nowhere: not by the API, not in the server's or the agent's files.
    listed = cluster.graphql("{ secrets { name isSet } }")
    assert listed["secrets"] == [{"name": "hf-token", "isSet": True}]
    for path in [
        cluster.server.log,
        cluster.agent("m1").log,
        *cluster.agent("m1").data_dir.rglob("*"),
    ]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
