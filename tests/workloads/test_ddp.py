"""Real two-rank PyTorch DDP (gloo, CPU) through `astraeus up` and its local agent, with scripts
as a user writes them (tests/workloads/scripts/): nothing of Astraeus in them but the optional
progress file (issue 20: before, MASTER_ADDR was the machine's name `local`, which does not
resolve, and both ranks timed out in init_process_group).

The three runs are submitted together (a module's fixture), so that one wait for the tick
counts them all:
- a healthy run completes, both ranks' logs hold their steps, its GPU time is productive;
- rank 1 ends at step 5: the run's reason names rank 1's worker, its last_failure holds its last
  lines, rank 0's log holds gloo's error (its peer closed the connection);
- each worker runs `torchrun --nnodes=$WORLD_SIZE --node_rank=$RANK …`: it completes;
- the same script as a user's project's train.py, shipped with `astra astraeus submit --workdir .`
  (issue 41), runs from each rank's own copy and completes;
- a run that checkpoints every 10 steps (rank 0, on a drive) loses rank 1 at step 25, restarts,
  resumes after its checkpoint at step 19 and completes: steps 20 to 24 were done twice, and
  the productive time from the restart until step 24 again is its rework (issue 23).
Each run's ledger is checked to the second against the worker intervals behind it, and those
against the workers' histories (seed goodput: categories as its table says).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ASTRA
from tests.workloads.conftest import Workloads
from tests.workloads.ledger import (
    Api,
    History,
    Intervals,
    at,
    check_ledger,
    counted,
    spec,
    wait_ended,
)

TORCHRUN = (
    "torchrun --nnodes=$WORLD_SIZE --node_rank=$RANK --master_addr=$MASTER_ADDR "
    "--master_port=$MASTER_PORT --nproc_per_node=1 {script} --steps 20 --sleep 0.25"
)
RUNS = ("ddp", "ddp-crash", "ddp-torchrun", "ddp-resume", "ddp-workdir")
RESUME = ["--steps", "40", "--sleep", "0.25", "--fail-at", "25"]


def workdir_submit(api: Api, workloads: Workloads, root: Path) -> subprocess.CompletedProcess[str]:
    """The user's project, with their DDP script as train.py and what git leaves out (their
    checkpoints), shipped with the run (issue 41: `astra astraeus submit --workdir .`); the
    machine never had it."""
    project = root / "llm"
    project.mkdir()
    shutil.copyfile(workloads.scripts / "ddp_train.py", project / "train.py")
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "old.pt").write_bytes(b"\0" * 2**20)
    (project / ".gitignore").write_text("checkpoints/\n")
    command = ["python", "train.py", "--steps", "20", "--sleep", "0.25"]
    (root / "spec.json").write_text(json.dumps(spec("ddp-workdir", workloads, command)))
    return subprocess.run(
        [ASTRA, "astraeus", "submit", str(root / "spec.json"), "--workdir", "."],
        cwd=project,
        env=api.server.env_for(api.headers["Authorization"].removeprefix("Bearer ")),
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def jobs(
    api: Api,
    workloads: Workloads,
    shared_folder: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, Any]]:
    script = str(workloads.scripts / "ddp_train.py")
    api.submit(spec("ddp", workloads, ["python", script, "--steps", "20", "--sleep", "0.25"]))
    api.submit(
        spec(
            "ddp-crash",
            workloads,
            ["python", script, "--steps", "200", "--sleep", "0.25", "--exit-at", "5"],
        )
    )
    api.submit(spec("ddp-torchrun", workloads, ["sh", "-c", TORCHRUN.format(script=script)]))
    api.submit(
        spec(
            "ddp-resume",
            workloads,
            ["python", script, *RESUME, "--checkpoint", str(shared_folder / "state.pt")],
            restart_policy="on_failure",
        )
    )
    shipped = workdir_submit(api, workloads, tmp_path_factory.mktemp("project"))
    assert shipped.returncode == 0, shipped.stderr
    # The local machine's two cores take one gang at a time (a worker asks for a core), and a
    # rank imports torch in 2 s on an idle core: a minute each when the cores are shared.
    return wait_ended(api, RUNS, 600)


def test_a_healthy_two_rank_ddp_run_completes_with_both_ranks_logs(
    api: Api, jobs: dict[str, dict[str, Any]]
) -> None:
    job = jobs["ddp"]
    assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed")
    for rank in (0, 1):
        lines = api.log(f"ddp-{rank}").splitlines()
        assert f"rank {rank} of 2: joined at 127.0.0.1:" in "\n".join(lines)
        steps = [line for line in lines if line.startswith(f"rank {rank} step ")]
        assert [s.split()[3] for s in steps] == [str(i) for i in range(20)]
        assert lines[-1] == f"rank {rank}: done"


def test_a_ddp_script_shipped_with_workdir_runs_from_each_ranks_own_copy(
    api: Api, jobs: dict[str, dict[str, Any]]
) -> None:
    job = jobs["ddp-workdir"]
    assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed")
    assert job["code"]["files"] == 2 and job["code"]["stored"]  # train.py, .gitignore
    for rank in (0, 1):
        lines = api.log(f"ddp-workdir-{rank}").splitlines()
        assert f"rank {rank} of 2: joined at 127.0.0.1:" in "\n".join(lines)
        assert lines[-1] == f"rank {rank}: done"


def test_the_machine_shows_the_address_gangs_reach_it_at(api: Api) -> None:
    # the embedded agent advertises loopback: MASTER_ADDR of every gang placed there
    machines = api.graphql("{ machines { name address } }")["machines"]
    assert machines == [{"name": "local", "address": "127.0.0.1"}]
    spec = api.graphql('{ run(name: "ddp") { workers { name } } }')
    assert spec["run"]["workers"] == [{"name": "ddp-0"}, {"name": "ddp-1"}]


def test_rank_1_ending_names_rank_1_and_rank_0_logs_glooss_error(
    api: Api, jobs: dict[str, dict[str, Any]]
) -> None:
    job = jobs["ddp-crash"]
    assert (job["status"], job["reason"]) == (
        "Failed",
        "Worker ddp-crash-1 failed on local: Exited with code 3; the gang does not run without it",
    )
    failed = api.get("/tasks/ddp-crash-1").json()
    snapshot = failed["last_failure"]
    assert snapshot["exit_code"] == 3
    assert snapshot["log_tail"].splitlines()[-1] == "rank 1: giving up at step 5"
    assert "rank 1 step 4 loss " in snapshot["log_tail"]
    rank0 = api.log("ddp-crash-0")
    assert "rank 0 step 4 loss " in rank0
    # gloo's own words when its peer is gone (the process ends of it, or is stopped first)
    assert "Connection closed by peer" in rank0 or "Connection reset by peer" in rank0, rank0


def test_torchrun_in_each_worker_completes(api: Api, jobs: dict[str, dict[str, Any]]) -> None:
    job = jobs["ddp-torchrun"]
    assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed")
    for rank in (0, 1):
        text = api.log(f"ddp-torchrun-{rank}")
        assert f"rank {rank} step 19 loss " in text and f"rank {rank}: done" in text, text


# -- the ledger, to the second ----------------------------------------------------------------


@pytest.fixture(scope="module")
def ledgers(api: Api, jobs: dict[str, dict[str, Any]]) -> dict[str, tuple[History, Intervals]]:
    """Each run's workers' histories and its intervals, once counted to their ends."""
    return counted(api, RUNS)


@pytest.mark.parametrize("run", RUNS)
def test_the_ledger_is_the_workers_history_to_the_second(
    api: Api, ledgers: dict[str, tuple[History, Intervals]], run: str
) -> None:
    history, intervals = ledgers[run]
    ledger = check_ledger(api, run, history, intervals)
    if run != "ddp-crash":
        # stepping, with the progress file appended to: the simulated GPUs were busy
        assert ledger["productiveGpuHours"] * 3600 > 5, ledger


def test_a_run_killed_mid_way_redoes_the_steps_since_its_checkpoint(
    api: Api, ledgers: dict[str, tuple[History, Intervals]]
) -> None:
    job = api.job("ddp-resume")
    assert (job["status"], job["reason"]) == ("Completed", "2 of 2 workers completed")
    first = api.log("ddp-resume-0")
    assert "rank 0: model ready, training from step 20" in first, first
    found = api.get("/runs/ddp-resume/goodput").json()
    rework = found["rework"]
    (redo,) = rework["redos"]
    assert (redo["attempt"], redo["checkpoint_step"], redo["reached_step"]) == (2, 19, 24)
    assert redo["steps_redone"] == 5 and redo["caught_up"], redo
    # a part of productive time, inside the span from the restart to step 24 again (2 GPUs)
    span = (at(redo["until"]) - at(redo["restarted_at"])).total_seconds()
    assert 0 < rework["gpu_hours"] == redo["gpu_hours"] <= found["productive_gpu_hours"]
    assert rework["gpu_hours"] * 3600 <= 2 * span + 1e-6
    ours = api.graphql(
        '{ run(name: "ddp-resume") { rework { gpuHours redos { stepsRedone checkpointStep } } } }'
    )["run"]["rework"]
    assert ours["gpuHours"] == pytest.approx(rework["gpu_hours"])
    assert ours["redos"] == [{"stepsRedone": 5, "checkpointStep": 19}]


def test_the_machine_its_ranks_failed_on_tops_machines_worst(
    api: Api, jobs: dict[str, dict[str, Any]]
) -> None:
    # issue 23: ddp-crash's rank 1 and ddp-resume's rank 1 failed on the local machine; their
    # rank 0s died of the lost peer (gloo's words in their logs): not the machine's failures
    env = api.server.env_for(api.server.admin_token)
    env["HOME"] = str(api.server.log.parent)
    done = subprocess.run(
        [ASTRA, "astraeus", "machines", "--worst"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    header, first, *_ = done.stdout.splitlines()
    assert header.split()[:2] == ["MACHINE", "POOL"]
    assert first.split()[0] == "local" and " 2 (program 2) " in first, done.stdout
    found = api.graphql("{ machineHealth { machines { machine failureCount action } } }")
    (local,) = found["machineHealth"]["machines"]
    assert (local["machine"], local["failureCount"]) == ("local", 2)
    assert local["action"].startswith("watch: 2 failures, ")  # alone: no pool to compare with
